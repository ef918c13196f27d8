// f32 element-wise arithmetic, checked exactly (check.expect_eq).
func.func @main() -> tensor<4xf32> {
  %x = stablehlo.constant dense<[1.5, -2.0, 0.25, 8.0]> : tensor<4xf32>
  %y = stablehlo.constant dense<[0.5, 4.0, -0.25, 2.0]> : tensor<4xf32>
  %sum = stablehlo.add %x, %y : tensor<4xf32>
  %prod = stablehlo.multiply %sum, %y : tensor<4xf32>
  %want = stablehlo.constant dense<[1.0, 8.0, 0.0, 20.0]> : tensor<4xf32>
  stablehlo.custom_call @check.expect_eq(%prod, %want) {has_side_effect = true} : (tensor<4xf32>, tensor<4xf32>) -> ()
  return %prod : tensor<4xf32>
}

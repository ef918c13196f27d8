// bf16 arithmetic and a conversion from f32 (round to nearest even).
func.func @main() -> tensor<3xbf16> {
  %x = stablehlo.constant dense<[1.0, 3.0, -0.5]> : tensor<3xbf16>
  %y = stablehlo.add %x, %x : tensor<3xbf16>
  %want = stablehlo.constant dense<[2.0, 6.0, -1.0]> : tensor<3xbf16>
  stablehlo.custom_call @check.expect_eq(%y, %want) : (tensor<3xbf16>, tensor<3xbf16>) -> ()
  %f = stablehlo.constant dense<[1.00390625, 257.0]> : tensor<2xf32>
  %b = stablehlo.convert %f : (tensor<2xf32>) -> tensor<2xbf16>
  stablehlo.custom_call @check.expect_eq_const(%b) {value = dense<[1.0, 256.0]> : tensor<2xbf16>} : (tensor<2xbf16>) -> ()
  return %y : tensor<3xbf16>
}

// i32 iota, shifts and a reduction, checked against constants
// (check.expect_eq_const: the expected value is an attribute).
func.func @main() -> tensor<i32> {
  %i = stablehlo.iota dim = 0 : tensor<6xi32>
  %one = stablehlo.constant dense<1> : tensor<6xi32>
  %s = stablehlo.shift_left %i, %one : tensor<6xi32>
  stablehlo.custom_call @check.expect_eq_const(%s) {has_side_effect = true, value = dense<[0, 2, 4, 6, 8, 10]> : tensor<6xi32>} : (tensor<6xi32>) -> ()
  %zero = stablehlo.constant dense<0> : tensor<i32>
  %total = stablehlo.reduce(%s init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<6xi32>, tensor<i32>) -> tensor<i32>
  stablehlo.custom_call @check.expect_eq_const(%total) {value = dense<30> : tensor<i32>} : (tensor<i32>) -> ()
  return %total : tensor<i32>
}

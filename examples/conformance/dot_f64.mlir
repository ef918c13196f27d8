// f64 matrix product, checked within the almost_eq tolerance.
func.func @main() -> tensor<2x2xf64> {
  %a = stablehlo.constant dense<[[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]> : tensor<2x3xf64>
  %b = stablehlo.constant dense<[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]> : tensor<3x2xf64>
  %c = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<2x3xf64>, tensor<3x2xf64>) -> tensor<2x2xf64>
  %want = stablehlo.constant dense<[[2.2, 2.8], [4.9, 6.4]]> : tensor<2x2xf64>
  stablehlo.custom_call @check.expect_almost_eq(%c, %want) {has_side_effect = true} : (tensor<2x2xf64>, tensor<2x2xf64>) -> ()
  return %c : tensor<2x2xf64>
}

// Transcendental f32 results, checked in ulps (check.expect_close).
func.func @main() -> tensor<4xf32> {
  %x = stablehlo.constant dense<[0.0, 1.0, -1.0, 2.5]> : tensor<4xf32>
  %e = stablehlo.exponential %x : tensor<4xf32>
  %want = stablehlo.constant dense<[1.0, 2.71828183, 0.367879441, 12.1824940]> : tensor<4xf32>
  stablehlo.custom_call @check.expect_close(%e, %want) {has_side_effect = true, max_ulp_difference = 4 : i64} : (tensor<4xf32>, tensor<4xf32>) -> ()
  %l = stablehlo.log %e : tensor<4xf32>
  stablehlo.custom_call @check.expect_almost_eq(%l, %x) {has_side_effect = true} : (tensor<4xf32>, tensor<4xf32>) -> ()
  return %e : tensor<4xf32>
}

// complex64 multiplication and absolute value.
func.func @main() -> tensor<2xcomplex<f32>> {
  %a = stablehlo.constant dense<[(1.0, 2.0), (0.0, -1.0)]> : tensor<2xcomplex<f32>>
  %b = stablehlo.constant dense<[(3.0, -1.0), (0.0, 1.0)]> : tensor<2xcomplex<f32>>
  %p = stablehlo.multiply %a, %b : tensor<2xcomplex<f32>>
  %want = stablehlo.constant dense<[(5.0, 5.0), (1.0, 0.0)]> : tensor<2xcomplex<f32>>
  stablehlo.custom_call @check.expect_almost_eq(%p, %want) : (tensor<2xcomplex<f32>>, tensor<2xcomplex<f32>>) -> ()
  %m = stablehlo.abs %p : (tensor<2xcomplex<f32>>) -> tensor<2xf32>
  stablehlo.custom_call @check.expect_close(%m, %m) : (tensor<2xf32>, tensor<2xf32>) -> ()
  stablehlo.custom_call @check.expect_almost_eq_const(%m) {value = dense<[7.0710678, 1.0]> : tensor<2xf32>} : (tensor<2xf32>) -> ()
  return %p : tensor<2xcomplex<f32>>
}

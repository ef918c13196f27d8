// A program with arguments: scale_npy.input0.npy is %x, scale_npy.expected0.npy
// the expected first result.
func.func @main(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %two = stablehlo.constant dense<2.0> : tensor<2x3xf32>
  %y = stablehlo.multiply %x, %two : tensor<2x3xf32>
  return %y : tensor<2x3xf32>
}

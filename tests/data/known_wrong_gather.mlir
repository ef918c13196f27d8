func.func @main() {
  %op = stablehlo.constant dense<[[[0.0, 1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0, 9.0], [10.0, 11.0, 12.0, 13.0, 14.0]], [[15.0, 16.0, 17.0, 18.0, 19.0], [20.0, 21.0, 22.0, 23.0, 24.0], [25.0, 26.0, 27.0, 28.0, 29.0]]]> : tensor<2x3x5xf32>
  %idx = stablehlo.constant dense<[[2], [2]]> : tensor<2x1xi32>
  %g = "stablehlo.gather"(%op, %idx) <{dimension_numbers = #stablehlo.gather<offset_dims = [0, 2], collapsed_slice_dims = [1], start_index_map = [1], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 2, 1, 5>}> : (tensor<2x3x5xf32>, tensor<2x1xi32>) -> tensor<2x2x5xf32>
  %m = stablehlo.constant dense<[true, false]> : tensor<2xi1>
  %mb = stablehlo.broadcast_in_dim %m, dims = [1] : (tensor<2xi1>) -> tensor<2x2x5xi1>
  %z = stablehlo.constant dense<-1.0> : tensor<2x2x5xf32>
  %r = stablehlo.select %mb, %g, %z : tensor<2x2x5xi1>, tensor<2x2x5xf32>
  %want = stablehlo.constant dense<[[[10.0, 11.0, 12.0, 13.0, 14.0], [-1.0, -1.0, -1.0, -1.0, -1.0]], [[25.0, 26.0, 27.0, 28.0, 29.0], [-1.0, -1.0, -1.0, -1.0, -1.0]]]> : tensor<2x2x5xf32>
  stablehlo.custom_call @check.expect_eq(%r, %want) {has_side_effect = true} : (tensor<2x2x5xf32>, tensor<2x2x5xf32>) -> ()
  return
}

// The older testdata form: inputs and expected values in private functions,
// and a check.eq whose i1 result @main returns.
module @legacy {
  func.func public @main() -> tensor<i1> {
    %0:2 = call @inputs() : () -> (tensor<2x3xi32>, tensor<2x3xi32>)
    %1 = call @expected() : () -> tensor<2x3xi32>
    %2 = stablehlo.maximum %0#0, %0#1 : tensor<2x3xi32>
    %3 = stablehlo.custom_call @check.eq(%2, %1) : (tensor<2x3xi32>, tensor<2x3xi32>) -> tensor<i1>
    return %3 : tensor<i1>
  }
  func.func private @inputs() -> (tensor<2x3xi32>, tensor<2x3xi32>) {
    %0 = stablehlo.constant dense<[[1, -5, 7], [0, 3, -2]]> : tensor<2x3xi32>
    %1 = stablehlo.constant dense<[[2, -6, 7], [-1, 4, -3]]> : tensor<2x3xi32>
    return %0, %1 : tensor<2x3xi32>, tensor<2x3xi32>
  }
  func.func private @expected() -> tensor<2x3xi32> {
    %0 = stablehlo.constant dense<[[2, -5, 7], [0, 4, -2]]> : tensor<2x3xi32>
    return %0 : tensor<2x3xi32>
  }
}

// i1 results of a comparison, checked with the generic custom_call syntax.
func.func @main() -> tensor<5xi1> {
  %x = stablehlo.constant dense<[-2, -1, 0, 1, 2]> : tensor<5xi32>
  %zero = stablehlo.constant dense<0> : tensor<5xi32>
  %gt = stablehlo.compare GT, %x, %zero, SIGNED : (tensor<5xi32>, tensor<5xi32>) -> tensor<5xi1>
  %want = stablehlo.constant dense<[false, false, false, true, true]> : tensor<5xi1>
  "stablehlo.custom_call"(%gt, %want) {call_target_name = "check.expect_eq", has_side_effect = true} : (tensor<5xi1>, tensor<5xi1>) -> ()
  return %gt : tensor<5xi1>
}

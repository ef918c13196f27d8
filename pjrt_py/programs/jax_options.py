"""What jax 0.10.2 sends to XLA with every compile (generated).

Written by ``tools/gen_jax_options.py`` from jaxlib 0.10.2; do not edit.
The numbers are field numbers of xla.DebugOptions, ExecutableBuildOptionsProto
and CompileOptionsProto; ``tests/test_compile_options.py`` checks them against
the installed jaxlib.
"""

JAXLIB_VERSION = "0.10.2"

# The xla.DebugOptions message jax sends (the defaults of XLA's flags, with
# xla_cpu_enable_fast_min_max = false among them), encoded.
DEBUG_OPTIONS = bytes.fromhex(
    "f80103980201e00301ea030e2e2f637564615f73646b5f6c6962b00401b80401c00401c80400880600980600"
    "a00600b00601c80600d00600a00700c00701c80701d00701d80704f00701880801980800a008ffffffffffff"
    "ffffff01c80800d00800e00800f008ffffffffffffffffff01800900a80900e8098780800f980affffffffff"
    "ffffffff01a00a01b00a01d00a01a80b00b00b00c80b01d00b00d80b00e00b01e80b01f00b01d80c00e80c01"
    "800d05880d01920d00a00d8780800fa80d8780800fc00d01c80d00d80d00800e008d0ecdcc8c3f980e00a00e"
    "80808004b80e01d80e00e00e00e80effffffffffffffff7f800f00b00f00b80f01c00f00d00f01d80f0fe00f"
    "01e80f01f00f00f80f0080100088100092100705020803070901981001a0105faa1000b01000c810a08d06d8"
    "1000e01000e81000801101881100901100a81100c01101d81164e01100e81100f81100801200901200981200"
    "a81210b01203c01200e01201e81200801301881300a0138002b21300b81310c01300d81300e513cdcccc3de8"
    "1300f01305981420a01401b8140ac0141ec81400d81440ea1400f01400f814008015018815009815ffffffff"
    "ffffffffff01a01500a81501b01501b81500c01500c81500d81500e01500e81500f01500f81500881600a016"
    "01aa16130a0d6368756e6b5f707265705f757312022d31aa16160a106368756e6b5f73697a655f6279746573"
    "12022d31aa16130a0d677075735f7065725f6e6f646512022d31aa16170a116e63636c5f6f705f6c61756e63"
    "685f757312022d31aa16140a0e6e69635f73706565645f6762707312022d31aa160c0a067274745f75731202"
    "2d31b81601d01601d81600e81600f01600801700901700a01700b01700b81701c01701ca1700d0178780800f"
    "d81700e01700e81701f01700fa1700801800981801a01800a81801b01801b81814c01828c81800d81800e818"
    "00881900981900a01902b01900ba1900c01900c81901d01901d81900e01900e81900f01900881a28901a1498"
    "1a00a01a01a81a00b21a03040503c81a01d01a00e01a00e81a00f81a00801b00981b01a01b01a81b01b01b88"
    "0eb81b00c01b00c81b00e01b00801c00881c80808002901c019a1c03696e66a01c00a81c00b01c00b81c00c0"
    "1c00c81c00d81c20e01c01e81c8010f81c00881d02901d01a81d00b01d00b81d00c01d00c81d01d81d00e01d"
    "01f01d00f81d01801e01901e01981e02a01e00a81e01b01e00b81e00c01e00c81e00d01e00e01e00e81e01a8"
    "1f01b01f00802000"
)

# ExecutableBuildOptionsProto fields jax sets besides the debug options and the
# counts, placement and partitioner flags pjrt_py encodes itself.
BUILD_INT_FIELDS = {1: 18446744073709551615, 23: 1, 25: 29}
BUILD_BYTES_FIELDS = {12: b"\x00", 18: b"\x00"}
# CompileOptionsProto fields (5: profile_version = -1, "do not look one up").
TOP_INT_FIELDS = {5: 18446744073709551615}

# Debug options by name -> (field number, kind), for Client.compile(debug_options=...).
DEBUG_OPTION_FIELDS = {
    "xla_backend_optimization_level": (31, "int"),
    "xla_cpu_enable_fast_math": (99, "bool"),
    "xla_cpu_enable_xprof_traceme": (137, "bool"),
    "xla_cpu_fast_math_honor_division": (126, "bool"),
    "xla_cpu_fast_math_honor_functions": (129, "bool"),
    "xla_cpu_fast_math_honor_infs": (121, "bool"),
    "xla_cpu_fast_math_honor_nans": (120, "bool"),
    "xla_detailed_logging": (252, "bool"),
    "xla_disable_hlo_passes": (30, "str"),
    "xla_dump_compress_protos": (151, "bool"),
    "xla_dump_disable_metadata": (153, "bool"),
    "xla_dump_fusion_visualization": (149, "bool"),
    "xla_dump_hlo_as_dot": (114, "bool"),
    "xla_dump_hlo_as_html": (116, "bool"),
    "xla_dump_hlo_as_long_text": (164, "bool"),
    "xla_dump_hlo_as_proto": (113, "bool"),
    "xla_dump_hlo_as_text": (112, "bool"),
    "xla_dump_hlo_as_url": (115, "bool"),
    "xla_dump_hlo_module_re": (110, "str"),
    "xla_dump_hlo_pass_re": (111, "str"),
    "xla_dump_hlo_pipeline_re": (154, "str"),
    "xla_dump_hlo_snapshots": (118, "bool"),
    "xla_dump_max_hlo_modules": (132, "int"),
    "xla_dump_module_metadata": (144, "bool"),
    "xla_dump_to": (109, "str"),
    "xla_enable_dumping": (253, "bool"),
    "xla_enable_hlo_passes_only": (124, "str"),
    "xla_force_host_platform_device_count": (102, "int"),
    "xla_gpu_cuda_data_dir": (61, "str"),
    "xla_gpu_dump_autotune_logs_to": (292, "str"),
    "xla_gpu_dump_autotune_results_to": (222, "str"),
    "xla_gpu_enable_fast_min_max": (100, "bool"),
    "xla_gpu_enable_llvm_module_compilation_parallelism": (268, "bool"),
    "xla_gpu_kernel_cache_file": (306, "str"),
    "xla_gpu_load_autotune_results_from": (223, "str"),
    "xla_gpu_per_fusion_autotune_cache_dir": (310, "str"),
    "xla_llvm_disable_expensive_passes": (73, "bool"),
    "xla_test_all_input_layouts": (91, "bool"),
    "xla_cpu_enable_fast_min_max": (140, "bool"),
}

"""Field numbers of ``xla.CompileOptionsProto`` and the messages inside it.

From xla/pjrt/proto/compile_options.proto and xla/xla.proto; the encoder
(``compile_options``) and the checker (``placement``) both use them.
"""

# CompileOptionsProto
EXECUTABLE_BUILD_OPTIONS = 3
COMPILE_PORTABLE_EXECUTABLE = 4
# ExecutableBuildOptionsProto
DEVICE_ORDINAL = 1
DEBUG_OPTIONS = 3
NUM_REPLICAS = 4
NUM_PARTITIONS = 5
USE_SPMD_PARTITIONING = 6
DEVICE_ASSIGNMENT = 9
USE_SHARDY_PARTITIONER = 19
# DeviceAssignmentProto
REPLICA_COUNT = 1
COMPUTATION_COUNT = 2
COMPUTATION_DEVICES = 3
# DeviceAssignmentProto.ComputationDevice
REPLICA_DEVICE_IDS = 1

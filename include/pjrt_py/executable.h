/* cdef: executable queries. Execution goes through the C helpers. */

typedef struct {
  size_t struct_size;
  PJRT_LoadedExecutable* loaded_executable;
  PJRT_Executable* executable;
  ...;
} PJRT_LoadedExecutable_GetExecutable_Args;
#define PJRT_LoadedExecutable_GetExecutable_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_LoadedExecutable* executable;
  PJRT_Device* const* addressable_devices;
  size_t num_addressable_devices;
  ...;
} PJRT_LoadedExecutable_AddressableDevices_Args;
#define PJRT_LoadedExecutable_AddressableDevices_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Executable* executable;
  const char* executable_name;
  size_t executable_name_size;
  ...;
} PJRT_Executable_Name_Args;
#define PJRT_Executable_Name_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Executable* executable;
  size_t num_outputs;
  ...;
} PJRT_Executable_NumOutputs_Args;
#define PJRT_Executable_NumOutputs_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Executable* executable;
  PJRT_Buffer_Type* output_types;
  size_t num_output_types;
  ...;
} PJRT_Executable_OutputElementTypes_Args;
#define PJRT_Executable_OutputElementTypes_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Executable* executable;
  size_t num_outputs;
  const int64_t* dims;
  const size_t* dim_sizes;
  ...;
} PJRT_Executable_OutputDimensions_Args;
#define PJRT_Executable_OutputDimensions_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Executable* executable;
  size_t num_replicas;
  ...;
} PJRT_Executable_NumReplicas_Args;
#define PJRT_Executable_NumReplicas_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Executable* executable;
  size_t num_partitions;
  ...;
} PJRT_Executable_NumPartitions_Args;
#define PJRT_Executable_NumPartitions_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Executable* executable;
  const char* executable_fingerprint;
  size_t executable_fingerprint_size;
  ...;
} PJRT_Executable_Fingerprint_Args;
#define PJRT_Executable_Fingerprint_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Executable* executable;
  PJRT_Program* program;
  ...;
} PJRT_Executable_OptimizedProgram_Args;
#define PJRT_Executable_OptimizedProgram_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Executable* executable;
  size_t num_properties;
  const PJRT_NamedValue* properties;
  ...;
} PJRT_Executable_GetCostAnalysis_Args;
#define PJRT_Executable_GetCostAnalysis_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Executable* executable;
  int64_t generated_code_size_in_bytes;
  int64_t argument_size_in_bytes;
  int64_t output_size_in_bytes;
  int64_t alias_size_in_bytes;
  int64_t temp_size_in_bytes;
  int64_t host_generated_code_size_in_bytes;
  int64_t host_argument_size_in_bytes;
  int64_t host_output_size_in_bytes;
  int64_t host_alias_size_in_bytes;
  int64_t host_temp_size_in_bytes;
  ...;
} PJRT_Executable_GetCompiledMemoryStats_Args;
#define PJRT_Executable_GetCompiledMemoryStats_Args_STRUCT_SIZE ...

/* Serialization. The bytes live until serialized_executable_deleter runs:
 * pjrt_py copies them out and calls it at once. */
typedef struct PJRT_SerializedExecutable PJRT_SerializedExecutable;

typedef struct {
  size_t struct_size;
  const PJRT_Executable* executable;
  const char* serialized_bytes;
  size_t serialized_bytes_size;
  PJRT_SerializedExecutable* serialized_executable;
  void (*serialized_executable_deleter)(PJRT_SerializedExecutable* exec);
  ...;
} PJRT_Executable_Serialize_Args;
#define PJRT_Executable_Serialize_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Client* client;
  const char* serialized_executable;
  size_t serialized_executable_size;
  PJRT_LoadedExecutable* loaded_executable;
  const char* overridden_serialized_compile_options;
  size_t overridden_serialized_compile_options_size;
  ...;
} PJRT_Executable_DeserializeAndLoad_Args;
#define PJRT_Executable_DeserializeAndLoad_Args_STRUCT_SIZE ...

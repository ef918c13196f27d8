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

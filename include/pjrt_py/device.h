/* cdef: devices and their descriptions. */

typedef struct {
  size_t struct_size;
  PJRT_Device* device;
  PJRT_DeviceDescription* device_description;
  ...;
} PJRT_Device_GetDescription_Args;
#define PJRT_Device_GetDescription_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Device* device;
  bool is_addressable;
  ...;
} PJRT_Device_IsAddressable_Args;
#define PJRT_Device_IsAddressable_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Device* device;
  int local_hardware_id;
  ...;
} PJRT_Device_LocalHardwareId_Args;
#define PJRT_Device_LocalHardwareId_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_DeviceDescription* device_description;
  int id;
  ...;
} PJRT_DeviceDescription_Id_Args;
#define PJRT_DeviceDescription_Id_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_DeviceDescription* device_description;
  int process_index;
  ...;
} PJRT_DeviceDescription_ProcessIndex_Args;
#define PJRT_DeviceDescription_ProcessIndex_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_DeviceDescription* device_description;
  size_t num_attributes;
  const PJRT_NamedValue* attributes;
  ...;
} PJRT_DeviceDescription_Attributes_Args;
#define PJRT_DeviceDescription_Attributes_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_DeviceDescription* device_description;
  const char* device_kind;
  size_t device_kind_size;
  ...;
} PJRT_DeviceDescription_Kind_Args;
#define PJRT_DeviceDescription_Kind_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_DeviceDescription* device_description;
  const char* to_string;
  size_t to_string_size;
  ...;
} PJRT_DeviceDescription_ToString_Args;
#define PJRT_DeviceDescription_ToString_Args_STRUCT_SIZE ...

/* Allocator statistics; each `*_is_set` says whether the plugin filled the
 * field before it (bytes_in_use is always set). */
typedef struct {
  size_t struct_size;
  PJRT_Device* device;
  int64_t bytes_in_use;
  int64_t peak_bytes_in_use;
  bool peak_bytes_in_use_is_set;
  int64_t num_allocs;
  bool num_allocs_is_set;
  int64_t largest_alloc_size;
  bool largest_alloc_size_is_set;
  int64_t bytes_limit;
  bool bytes_limit_is_set;
  int64_t bytes_reserved;
  bool bytes_reserved_is_set;
  int64_t peak_bytes_reserved;
  bool peak_bytes_reserved_is_set;
  int64_t bytes_reservable_limit;
  bool bytes_reservable_limit_is_set;
  int64_t largest_free_block_bytes;
  bool largest_free_block_bytes_is_set;
  int64_t pool_bytes;
  bool pool_bytes_is_set;
  int64_t peak_pool_bytes;
  bool peak_pool_bytes_is_set;
  ...;
} PJRT_Device_MemoryStats_Args;
#define PJRT_Device_MemoryStats_Args_STRUCT_SIZE ...

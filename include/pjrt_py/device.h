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

/* cdef: memory spaces (PJRT_Memory) of devices and clients. */

typedef struct {
  size_t struct_size;
  PJRT_Client* client;
  PJRT_Memory* const* addressable_memories;
  size_t num_addressable_memories;
  ...;
} PJRT_Client_AddressableMemories_Args;
#define PJRT_Client_AddressableMemories_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Device* device;
  PJRT_Memory* const* memories;
  size_t num_memories;
  ...;
} PJRT_Device_AddressableMemories_Args;
#define PJRT_Device_AddressableMemories_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Device* device;
  PJRT_Memory* memory;
  ...;
} PJRT_Device_DefaultMemory_Args;
#define PJRT_Device_DefaultMemory_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Memory* memory;
  int id;
  ...;
} PJRT_Memory_Id_Args;
#define PJRT_Memory_Id_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Memory* memory;
  const char* kind;
  size_t kind_size;
  ...;
} PJRT_Memory_Kind_Args;
#define PJRT_Memory_Kind_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Memory* memory;
  int kind_id;
  ...;
} PJRT_Memory_Kind_Id_Args;
#define PJRT_Memory_Kind_Id_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Memory* memory;
  const char* debug_string;
  size_t debug_string_size;
  ...;
} PJRT_Memory_DebugString_Args;
#define PJRT_Memory_DebugString_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Memory* memory;
  PJRT_Device* const* devices;
  size_t num_devices;
  ...;
} PJRT_Memory_AddressableByDevices_Args;
#define PJRT_Memory_AddressableByDevices_Args_STRUCT_SIZE ...

/* cdef: client creation, identity, devices and compilation. */

/* The key-value store callbacks (native/kv_store.c implements them). */
typedef struct PJRT_KeyValueGetCallback_Args PJRT_KeyValueGetCallback_Args;
typedef struct PJRT_KeyValueTryGetCallback_Args PJRT_KeyValueTryGetCallback_Args;
typedef struct PJRT_KeyValuePutCallback_Args PJRT_KeyValuePutCallback_Args;
typedef PJRT_Error* (*PJRT_KeyValueGetCallback)(PJRT_KeyValueGetCallback_Args*);
typedef PJRT_Error* (*PJRT_KeyValueTryGetCallback)(PJRT_KeyValueTryGetCallback_Args*);
typedef PJRT_Error* (*PJRT_KeyValuePutCallback)(PJRT_KeyValuePutCallback_Args*);

typedef struct {
  size_t struct_size;
  const PJRT_NamedValue* create_options;
  size_t num_options;
  PJRT_KeyValueGetCallback kv_get_callback;
  void* kv_get_user_arg;
  PJRT_KeyValuePutCallback kv_put_callback;
  void* kv_put_user_arg;
  PJRT_Client* client;
  PJRT_KeyValueTryGetCallback kv_try_get_callback;
  void* kv_try_get_user_arg;
  ...;
} PJRT_Client_Create_Args;
#define PJRT_Client_Create_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Client* client;
  const char* platform_name;
  size_t platform_name_size;
  ...;
} PJRT_Client_PlatformName_Args;
#define PJRT_Client_PlatformName_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Client* client;
  const char* platform_version;
  size_t platform_version_size;
  ...;
} PJRT_Client_PlatformVersion_Args;
#define PJRT_Client_PlatformVersion_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Client* client;
  int process_index;
  ...;
} PJRT_Client_ProcessIndex_Args;
#define PJRT_Client_ProcessIndex_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Client* client;
  PJRT_Device* const* devices;
  size_t num_devices;
  ...;
} PJRT_Client_Devices_Args;
#define PJRT_Client_Devices_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Client* client;
  PJRT_Device* const* addressable_devices;
  size_t num_addressable_devices;
  ...;
} PJRT_Client_AddressableDevices_Args;
#define PJRT_Client_AddressableDevices_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  char* code;
  size_t code_size;
  const char* format;
  size_t format_size;
  ...;
} PJRT_Program;
#define PJRT_Program_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Client* client;
  const PJRT_Program* program;
  const char* compile_options;
  size_t compile_options_size;
  PJRT_LoadedExecutable* executable;
  ...;
} PJRT_Client_Compile_Args;
#define PJRT_Client_Compile_Args_STRUCT_SIZE ...

/* cdef: plugin entry, versions, named values, and the function table.
 * Partial structs ("...;"): the C compiler takes the real layouts from the
 * plugin wheel's pjrt_c_api.h. Only the slots pjrt_py calls from Python are
 * listed; the C helpers see the full header. */

typedef struct PJRT_Extension_Base PJRT_Extension_Base;
typedef struct PJRT_Error PJRT_Error;
typedef struct PJRT_Event PJRT_Event;
typedef struct PJRT_Client PJRT_Client;
typedef struct PJRT_Device PJRT_Device;
typedef struct PJRT_DeviceDescription PJRT_DeviceDescription;
typedef struct PJRT_Memory PJRT_Memory;
typedef struct PJRT_Executable PJRT_Executable;
typedef struct PJRT_LoadedExecutable PJRT_LoadedExecutable;
typedef struct PJRT_Buffer PJRT_Buffer;

#define PJRT_API_MAJOR ...
#define PJRT_API_MINOR ...

typedef struct {
  size_t struct_size;
  int major_version;
  int minor_version;
  ...;
} PJRT_Api_Version;

typedef enum {
  PJRT_NamedValue_kString,
  PJRT_NamedValue_kInt64,
  PJRT_NamedValue_kInt64List,
  PJRT_NamedValue_kFloat,
  PJRT_NamedValue_kBool,
  ...
} PJRT_NamedValue_Type;

typedef struct {
  size_t struct_size;
  const char* name;
  size_t name_size;
  PJRT_NamedValue_Type type;
  union {
    const char* string_value;
    int64_t int64_value;
    const int64_t* int64_array_value;
    float float_value;
    bool bool_value;
  };
  size_t value_size;
  ...;
} PJRT_NamedValue;
#define PJRT_NamedValue_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  ...;
} PJRT_Plugin_Initialize_Args;
#define PJRT_Plugin_Initialize_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  const PJRT_NamedValue* attributes;
  size_t num_attributes;
  ...;
} PJRT_Plugin_Attributes_Args;
#define PJRT_Plugin_Attributes_Args_STRUCT_SIZE ...

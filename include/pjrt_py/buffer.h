/* cdef: buffer queries. Transfers and destruction go through the C helpers. */

typedef enum {
  PJRT_Buffer_Type_INVALID,
  PJRT_Buffer_Type_PRED,
  PJRT_Buffer_Type_S8,
  PJRT_Buffer_Type_S16,
  PJRT_Buffer_Type_S32,
  PJRT_Buffer_Type_S64,
  PJRT_Buffer_Type_U8,
  PJRT_Buffer_Type_U16,
  PJRT_Buffer_Type_U32,
  PJRT_Buffer_Type_U64,
  PJRT_Buffer_Type_F16,
  PJRT_Buffer_Type_F32,
  PJRT_Buffer_Type_F64,
  PJRT_Buffer_Type_BF16,
  PJRT_Buffer_Type_C64,
  PJRT_Buffer_Type_C128,
  PJRT_Buffer_Type_F8E5M2,
  PJRT_Buffer_Type_F8E4M3FN,
  PJRT_Buffer_Type_F8E4M3B11FNUZ,
  PJRT_Buffer_Type_F8E5M2FNUZ,
  PJRT_Buffer_Type_F8E4M3FNUZ,
  PJRT_Buffer_Type_S4,
  PJRT_Buffer_Type_U4,
  PJRT_Buffer_Type_TOKEN,
  PJRT_Buffer_Type_S2,
  PJRT_Buffer_Type_U2,
  PJRT_Buffer_Type_F8E4M3,
  PJRT_Buffer_Type_F8E3M4,
  PJRT_Buffer_Type_F8E8M0FNU,
  PJRT_Buffer_Type_F4E2M1FN,
  ...
} PJRT_Buffer_Type;

typedef enum {
  PJRT_HostBufferSemantics_kImmutableOnlyDuringCall,
  PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes,
  PJRT_HostBufferSemantics_kImmutableZeroCopy,
  PJRT_HostBufferSemantics_kMutableZeroCopy,
  ...
} PJRT_HostBufferSemantics;

typedef struct {
  size_t struct_size;
  PJRT_Buffer* buffer;
  PJRT_Buffer_Type type;
  ...;
} PJRT_Buffer_ElementType_Args;
#define PJRT_Buffer_ElementType_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Buffer* buffer;
  const int64_t* dims;
  size_t num_dims;
  ...;
} PJRT_Buffer_Dimensions_Args;
#define PJRT_Buffer_Dimensions_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Buffer* buffer;
  PJRT_Device* device;
  ...;
} PJRT_Buffer_Device_Args;
#define PJRT_Buffer_Device_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Buffer* buffer;
  ...;
} PJRT_Buffer_Delete_Args;
#define PJRT_Buffer_Delete_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Buffer* buffer;
  size_t on_device_size_in_bytes;
  ...;
} PJRT_Buffer_OnDeviceSizeInBytes_Args;
#define PJRT_Buffer_OnDeviceSizeInBytes_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Buffer* buffer;
  uintptr_t buffer_pointer;
  ...;
} PJRT_Buffer_UnsafePointer_Args;
#define PJRT_Buffer_UnsafePointer_Args_STRUCT_SIZE ...

typedef struct {
  size_t struct_size;
  PJRT_Buffer* buffer;
  PJRT_Device* dst_device;
  PJRT_Buffer* dst_buffer;
  ...;
} PJRT_Buffer_CopyToDevice_Args;
#define PJRT_Buffer_CopyToDevice_Args_STRUCT_SIZE ...

/* cdef: the function table, listing the slots pjrt_py calls from Python.
 * Before any call, pjrt_py checks the slot lies inside the plugin's
 * PJRT_Api.struct_size (see pjrt_py_slots in helpers.h). */

typedef struct {
  size_t struct_size;
  PJRT_Api_Version pjrt_api_version;

  PJRT_Error* (*PJRT_Plugin_Initialize)(PJRT_Plugin_Initialize_Args*);
  PJRT_Error* (*PJRT_Plugin_Attributes)(PJRT_Plugin_Attributes_Args*);

  PJRT_Error* (*PJRT_Client_Create)(PJRT_Client_Create_Args*);
  PJRT_Error* (*PJRT_Client_PlatformName)(PJRT_Client_PlatformName_Args*);
  PJRT_Error* (*PJRT_Client_ProcessIndex)(PJRT_Client_ProcessIndex_Args*);
  PJRT_Error* (*PJRT_Client_PlatformVersion)(PJRT_Client_PlatformVersion_Args*);
  PJRT_Error* (*PJRT_Client_Devices)(PJRT_Client_Devices_Args*);
  PJRT_Error* (*PJRT_Client_AddressableDevices)(PJRT_Client_AddressableDevices_Args*);
  PJRT_Error* (*PJRT_Client_Compile)(PJRT_Client_Compile_Args*);

  PJRT_Error* (*PJRT_DeviceDescription_Id)(PJRT_DeviceDescription_Id_Args*);
  PJRT_Error* (*PJRT_DeviceDescription_ProcessIndex)(PJRT_DeviceDescription_ProcessIndex_Args*);
  PJRT_Error* (*PJRT_DeviceDescription_Attributes)(PJRT_DeviceDescription_Attributes_Args*);
  PJRT_Error* (*PJRT_DeviceDescription_Kind)(PJRT_DeviceDescription_Kind_Args*);
  PJRT_Error* (*PJRT_DeviceDescription_ToString)(PJRT_DeviceDescription_ToString_Args*);

  PJRT_Error* (*PJRT_Device_GetDescription)(PJRT_Device_GetDescription_Args*);
  PJRT_Error* (*PJRT_Device_IsAddressable)(PJRT_Device_IsAddressable_Args*);
  PJRT_Error* (*PJRT_Device_LocalHardwareId)(PJRT_Device_LocalHardwareId_Args*);
  PJRT_Error* (*PJRT_Device_AddressableMemories)(PJRT_Device_AddressableMemories_Args*);
  PJRT_Error* (*PJRT_Device_DefaultMemory)(PJRT_Device_DefaultMemory_Args*);
  PJRT_Error* (*PJRT_Device_MemoryStats)(PJRT_Device_MemoryStats_Args*);
  PJRT_Error* (*PJRT_Client_AddressableMemories)(PJRT_Client_AddressableMemories_Args*);

  PJRT_Error* (*PJRT_Memory_Id)(PJRT_Memory_Id_Args*);
  PJRT_Error* (*PJRT_Memory_Kind)(PJRT_Memory_Kind_Args*);
  PJRT_Error* (*PJRT_Memory_Kind_Id)(PJRT_Memory_Kind_Id_Args*);
  PJRT_Error* (*PJRT_Memory_DebugString)(PJRT_Memory_DebugString_Args*);
  PJRT_Error* (*PJRT_Memory_AddressableByDevices)(PJRT_Memory_AddressableByDevices_Args*);

  PJRT_Error* (*PJRT_Executable_Name)(PJRT_Executable_Name_Args*);
  PJRT_Error* (*PJRT_Executable_NumOutputs)(PJRT_Executable_NumOutputs_Args*);
  PJRT_Error* (*PJRT_Executable_OutputElementTypes)(PJRT_Executable_OutputElementTypes_Args*);
  PJRT_Error* (*PJRT_Executable_OutputDimensions)(PJRT_Executable_OutputDimensions_Args*);
  PJRT_Error* (*PJRT_Executable_NumReplicas)(PJRT_Executable_NumReplicas_Args*);
  PJRT_Error* (*PJRT_Executable_NumPartitions)(PJRT_Executable_NumPartitions_Args*);
  PJRT_Error* (*PJRT_Executable_Fingerprint)(PJRT_Executable_Fingerprint_Args*);
  PJRT_Error* (*PJRT_Executable_OptimizedProgram)(PJRT_Executable_OptimizedProgram_Args*);
  PJRT_Error* (*PJRT_Executable_GetCostAnalysis)(PJRT_Executable_GetCostAnalysis_Args*);
  PJRT_Error* (*PJRT_Executable_GetCompiledMemoryStats)(
      PJRT_Executable_GetCompiledMemoryStats_Args*);
  PJRT_Error* (*PJRT_Executable_Serialize)(PJRT_Executable_Serialize_Args*);
  PJRT_Error* (*PJRT_Executable_DeserializeAndLoad)(PJRT_Executable_DeserializeAndLoad_Args*);
  PJRT_Error* (*PJRT_LoadedExecutable_GetExecutable)(PJRT_LoadedExecutable_GetExecutable_Args*);
  PJRT_Error* (*PJRT_LoadedExecutable_AddressableDevices)(
      PJRT_LoadedExecutable_AddressableDevices_Args*);

  PJRT_Error* (*PJRT_Buffer_ElementType)(PJRT_Buffer_ElementType_Args*);
  PJRT_Error* (*PJRT_Buffer_Dimensions)(PJRT_Buffer_Dimensions_Args*);
  PJRT_Error* (*PJRT_Buffer_OnDeviceSizeInBytes)(PJRT_Buffer_OnDeviceSizeInBytes_Args*);
  PJRT_Error* (*PJRT_Buffer_Device)(PJRT_Buffer_Device_Args*);
  PJRT_Error* (*PJRT_Buffer_Delete)(PJRT_Buffer_Delete_Args*);
  PJRT_Error* (*PJRT_Buffer_UnsafePointer)(PJRT_Buffer_UnsafePointer_Args*);
  PJRT_Error* (*PJRT_Buffer_CopyToDevice)(PJRT_Buffer_CopyToDevice_Args*);
  ...;
} PJRT_Api;

/* A stand-in for CUDA's cuda_runtime.h with what nccl.h depends on, so the
 * "CUDA headers included" path of the header compiles on machines without
 * CUDA: the include guard macro, CUDART_VERSION, and cudaStream_t declared
 * exactly as CUDA's driver_types.h does. */
#ifndef __CUDA_RUNTIME_H__
#define __CUDA_RUNTIME_H__
#define CUDART_VERSION 12080
typedef struct CUstream_st* cudaStream_t;
typedef enum cudaError_enum { cudaSuccess = 0 } cudaError_t;
#endif

// Planted GPU faults, one per mode, for the triage GPU tests: each mode provokes exactly one bug.
// Build: nvcc -lineinfo -arch=sm_90 -o planted_faults planted_faults.cu
// Run:   ./planted_faults <oob|misaligned|trap|assert|race|uninit|uaf>
#include <cassert>
#include <cstdio>
#include <cstring>
#include <cuda_runtime.h>

__global__ void write_oob(float *out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  out[i + n + 1024] = 1.0f;  // past the end, beyond any padding
}

__global__ void load_misaligned(const float *in, float *out) {
  const float4 *p = reinterpret_cast<const float4 *>(in + 1);  // 4-byte aligned, not 16
  float4 v = p[threadIdx.x];
  out[threadIdx.x] = v.x + v.y + v.z + v.w;  // all four lanes, so the load stays one 16-byte access
}

__global__ void trap_kernel(float *out) {
  if (threadIdx.x == 3) __trap();
  out[threadIdx.x] = 1.0f;
}

__global__ void assert_kernel(const int *idx, int rows) {
  int i = idx[threadIdx.x];
  assert(i < rows);
}

__global__ void shared_race(int *out) {
  __shared__ int buf[256];
  buf[threadIdx.x] = threadIdx.x;
  // Missing __syncthreads(): reads a neighbour's slot that may not be written yet.
  out[threadIdx.x] = buf[(threadIdx.x + 1) % 256];
}

__global__ void read_uninit(const float *in, float *out) {
  out[threadIdx.x] = in[threadIdx.x] * 2.0f;
}

__global__ void write_freed(float *p) { p[threadIdx.x] = 3.0f; }

static int report(const char *what) {
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    fprintf(stderr, "CUDA error: %s (%s) after %s\n", cudaGetErrorString(e), cudaGetErrorName(e), what);
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  float *f = nullptr, *g = nullptr;
  int *idx = nullptr;
  cudaMalloc(&f, 4096 * sizeof(float));
  cudaMalloc(&g, 4096 * sizeof(float));
  cudaMemset(f, 0, 4096 * sizeof(float));
  if (!strcmp(mode, "oob")) {
    write_oob<<<4, 256>>>(f, 1 << 26);
    return report("write_oob");
  } else if (!strcmp(mode, "misaligned")) {
    load_misaligned<<<1, 256>>>(f, g);
    return report("load_misaligned");
  } else if (!strcmp(mode, "trap")) {
    trap_kernel<<<1, 32>>>(f);
    return report("trap_kernel");
  } else if (!strcmp(mode, "assert")) {
    int host[32];
    for (int i = 0; i < 32; i++) host[i] = i * 10;
    cudaMalloc(&idx, sizeof(host));
    cudaMemcpy(idx, host, sizeof(host), cudaMemcpyHostToDevice);
    assert_kernel<<<1, 32>>>(idx, 100);
    return report("assert_kernel");
  } else if (!strcmp(mode, "race")) {
    shared_race<<<1, 256>>>(reinterpret_cast<int *>(g));
    if (report("shared_race")) return 1;
    fprintf(stderr, "result mismatch: output differs between runs\n");
    return 1;
  } else if (!strcmp(mode, "uninit")) {
    float *fresh = nullptr;
    cudaMalloc(&fresh, 256 * sizeof(float));
    read_uninit<<<1, 256>>>(fresh, g);
    if (report("read_uninit")) return 1;
    fprintf(stderr, "result mismatch: output differs between runs\n");
    return 1;
  } else if (!strcmp(mode, "uaf")) {
    float *gone = nullptr;
    cudaMalloc(&gone, 256 * sizeof(float));
    cudaFree(gone);
    write_freed<<<1, 256>>>(gone);
    return report("write_freed");
  }
  fprintf(stderr, "usage: planted_faults <oob|misaligned|trap|assert|race|uninit|uaf>\n");
  return 2;
}

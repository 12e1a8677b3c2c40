// Elementwise ops over `total` elements. copy_32 moves 32-bit words, so it serves f32 and i32 alike.
extern "C" __global__ void bias_add_f32(float *out, const float *x, const float *bias,
                                        long long total, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < total) out[i] = x[i] + bias[i % n];
}

extern "C" __global__ void relu_f32(float *out, const float *x, long long total) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < total) out[i] = fmaxf(x[i], 0.0f);
}

// The tanh approximation, as in GPT-2.
extern "C" __global__ void gelu_f32(float *out, const float *x, long long total) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= total) return;
  float v = x[i];
  out[i] = 0.5f * v * (1.0f + tanhf(0.7978846f * (v + 0.044715f * v * v * v)));
}

extern "C" __global__ void add_f32(float *out, const float *x, const float *y, long long total) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < total) out[i] = x[i] + y[i];
}

extern "C" __global__ void copy_32(unsigned int *out, const unsigned int *x, long long total) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < total) out[i] = x[i];
}

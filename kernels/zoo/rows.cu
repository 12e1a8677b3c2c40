// Last-axis ops, one thread per row: layernorm, softmax, sum and mean. One thread per row keeps the
// summation order of the CPU reference.
extern "C" __global__ void layernorm_f32(float *out, const float *x, const float *gamma,
                                         const float *beta, long long rows, long long n, float eps) {
  long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float *row = x + r * n;
  float mean = 0.0f;
  for (long long c = 0; c < n; ++c) mean += row[c];
  mean /= (float)n;
  float var = 0.0f;
  for (long long c = 0; c < n; ++c) var += (row[c] - mean) * (row[c] - mean);
  var /= (float)n;
  float inv = 1.0f / sqrtf(var + eps);
  for (long long c = 0; c < n; ++c) out[r * n + c] = (row[c] - mean) * inv * gamma[c] + beta[c];
}

extern "C" __global__ void softmax_f32(float *out, const float *x, long long rows, long long n) {
  long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float *row = x + r * n;
  float mx = __int_as_float(0xff800000);  // -inf; NVRTC has no <cmath> macros
  for (long long c = 0; c < n; ++c) mx = fmaxf(mx, row[c]);
  float sum = 0.0f;
  for (long long c = 0; c < n; ++c) sum += expf(row[c] - mx);
  for (long long c = 0; c < n; ++c) out[r * n + c] = expf(row[c] - mx) / sum;
}

extern "C" __global__ void sum_lastdim_f32(float *out, const float *x, long long rows, long long n) {
  long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float acc = 0.0f;
  for (long long c = 0; c < n; ++c) acc += x[r * n + c];
  out[r] = acc;
}

extern "C" __global__ void mean_lastdim_f32(float *out, const float *x, long long rows, long long n) {
  long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float acc = 0.0f;
  for (long long c = 0; c < n; ++c) acc += x[r * n + c];
  out[r] = acc * (1.0f / (float)n);
}

// Transpose of a [m, n] matrix of 32-bit words (f32 or i32).
extern "C" __global__ void transpose_32(unsigned int *out, const unsigned int *x, long long m,
                                        long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= m * n) return;
  long long row = i / n, col = i % n;
  out[col * m + row] = x[i];
}

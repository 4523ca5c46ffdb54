// a tiny Kernel Tuner style kernel: tunables arrive as macros
__global__ void vector_add(float *c, const float *a, const float *b, int n) {
    int i = blockIdx.x * block_size_x * tile_size_x + threadIdx.x;
    #pragma unroll
    for (int t = 0; t < tile_size_x; t++) {
        int j = i + t * block_size_x;
        if (j < n) {
            c[j] = a[j] + b[j];
        }
    }
}

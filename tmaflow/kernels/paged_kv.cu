// append_kv: one new key and value row a request into paged caches (num_pages, page_size,
// heads_kv x head_dim), at the position the request's length says, read on the device.
#include <tmaflow.cuh>
using namespace tmaflow;

extern "C" __global__ void append_kv(uint4* k_cache, uint4* v_cache, const uint4* k_new,
                                     const uint4* v_new, const int* block_table, const int* seq_lens,
                                     int row_elems, int page_size, int max_pages, int num_pages,
                                     int batch) {
  const int chunks = row_elems / 8;  // 16-byte chunks of one token's heads_kv x head_dim
  for (int b = blockIdx.x; b < batch; b += gridDim.x) {
    const int pos = seq_lens[b];
    if (pos < 0 || pos >= max_pages * page_size) continue;
    const int page = block_table[size_t(b) * max_pages + pos / page_size];
    if (page < 0 || page >= num_pages) continue;
    const size_t row = (size_t(page) * page_size + pos % page_size) * chunks;
    for (int i = threadIdx.x; i < chunks; i += blockDim.x) {
      k_cache[row + i] = k_new[size_t(b) * chunks + i];
      v_cache[row + i] = v_new[size_t(b) * chunks + i];
    }
  }
}

// NCCL reference for the CUDA benchmark: times ncclAllReduce / ncclReduceScatter / ncclAllGather
// with the conventions of torch_mpi_gpu.bench (size = the whole buffer: all_reduce's tensor,
// reduce_scatter's input, all_gather's output; fp32 sum; median over iterations of the slowest
// rank; busbw factors of nccl-tests), checks every result, and writes rows that
// `python -m torch_mpi_gpu.bench --external FILE` puts in its table beside mpigpu.
//
// Why a C program: torch's own NCCL (2.28 in the lent machine's torch 2.11) refuses two ranks on
// one GPU, and preloading NCCL 2.30 did not replace it there; this links NCCL 2.30 directly.
//
//   nvcc -O2 -ccbin mpicxx -I$NCCL/include-dir benchmarks/nccl_bench.cu -L$NCCL/lib -l:libnccl.so.2 \
//        -Xlinker -rpath=$NCCL/lib -o nccl_bench
//   NCCL_MULTI_RANK_GPU_ENABLE=1 mpirun -np 2 ./nccl_bench out.json 16 268435456 4
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CHECK_CUDA(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  std::fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); \
  MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)
#define CHECK_NCCL(x) do { ncclResult_t r = (x); if (r != ncclSuccess) { \
  std::fprintf(stderr, "NCCL error %s at %s:%d\n", ncclGetErrorString(r), __FILE__, __LINE__); \
  MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)

__global__ void fill(float* p, size_t n, int rank) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * (size_t)blockDim.x)
    p[i] = float(i % 7 + rank + 1);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, world;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const char* out = argc > 1 ? argv[1] : "nccl.json";
  const size_t begin = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 16;
  const size_t end = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : (256u << 20);
  const int factor = argc > 4 ? std::atoi(argv[4]) : 4;
  int devices = 0;
  CHECK_CUDA(cudaGetDeviceCount(&devices));
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  CHECK_CUDA(cudaSetDevice((local ? std::atoi(local) : rank) % devices));
  ncclUniqueId id;
  if (rank == 0) CHECK_NCCL(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  CHECK_NCCL(ncclCommInitRank(&comm, world, id, rank));
  int version = 0;
  ncclGetVersion(&version);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  FILE* json = rank == 0 ? std::fopen(out, "w") : nullptr;
  if (json) std::fprintf(json, "{\"nccl_version\": %d, \"ranks\": %d, \"rows\": [\n", version, world);
  bool first = true;
  int wrongTotal = 0;
  for (const std::string op : {"allreduce", "reduce_scatter", "allgather"}) {
    for (size_t bytes = begin; bytes <= end; bytes *= factor) {
      // element counts as torch_mpi_gpu.bench computes them
      const size_t es = 4;
      const bool split = op != "allreduce";
      const size_t per = split ? std::max<size_t>(1, bytes / es / world) : std::max<size_t>(1, bytes / es);
      const size_t count = split ? per * world : per;
      float *in = nullptr, *res = nullptr;
      CHECK_CUDA(cudaMalloc(&in, count * es));
      CHECK_CUDA(cudaMalloc(&res, count * es));
      auto call = [&] {
        if (op == "allreduce") CHECK_NCCL(ncclAllReduce(in, res, count, ncclFloat, ncclSum, comm, stream));
        else if (op == "reduce_scatter") CHECK_NCCL(ncclReduceScatter(in, res, per, ncclFloat, ncclSum, comm, stream));
        else CHECK_NCCL(ncclAllGather(in + 0, res, per, ncclFloat, comm, stream));
      };
      fill<<<256, 256, 0, stream>>>(in, count, rank);
      call();
      CHECK_CUDA(cudaStreamSynchronize(stream));
      // check: every element of the result
      const size_t outCount = op == "reduce_scatter" ? per : count;
      std::vector<float> host(outCount);
      CHECK_CUDA(cudaMemcpy(host.data(), res, outCount * es, cudaMemcpyDeviceToHost));
      long wrong = 0;
      for (size_t i = 0; i < outCount; ++i) {
        double expect;
        if (op == "allgather") expect = double((i % per) % 7 + i / per + 1);
        else {
          const size_t g = op == "reduce_scatter" ? rank * per + i : i;
          expect = 0;
          for (int r = 0; r < world; ++r) expect += double(g % 7 + r + 1);
        }
        if (double(host[i]) != expect) ++wrong;
      }
      const int iters = bytes < (16u << 20) ? 20 : 4;
      for (int w = 0; w < 3; ++w) call();
      CHECK_CUDA(cudaStreamSynchronize(stream));
      std::vector<double> t(iters);
      for (int k = 0; k < iters; ++k) {
        MPI_Barrier(MPI_COMM_WORLD);
        auto t0 = std::chrono::steady_clock::now();
        call();
        CHECK_CUDA(cudaStreamSynchronize(stream));
        t[k] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      MPI_Allreduce(MPI_IN_PLACE, t.data(), iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
      wrongTotal += wrong > 0;
      std::sort(t.begin(), t.end());
      const double med = iters % 2 ? t[iters / 2] : 0.5 * (t[iters / 2 - 1] + t[iters / 2]);
      const double p95 = t[std::min(iters - 1, int(0.95 * iters))];
      const double algbw = count * es / med / 1e9;
      const double bus = op == "allreduce" ? 2.0 * (world - 1) / world : double(world - 1) / world;
      if (json) {
        std::fprintf(json, "%s {\"op\": \"%s\", \"bytes\": %zu, \"backend\": \"nccl\", \"median_us\": %.3f, "
                     "\"p95_us\": %.3f, \"algbw_GBps\": %.4f, \"busbw_GBps\": %.4f, \"wrong\": %ld}",
                     first ? "" : ",\n", op.c_str(), count * es, med * 1e6, p95 * 1e6, algbw,
                     algbw * bus, wrong);
        std::printf("# nccl %d %s %zu: %.1f us, busbw %.3f GB/s, wrong %ld\n", version, op.c_str(),
                    count * es, med * 1e6, algbw * bus, wrong);
        std::fflush(stdout);
      }
      first = false;
      CHECK_CUDA(cudaFree(in));
      CHECK_CUDA(cudaFree(res));
    }
  }
  if (json) {
    std::fprintf(json, "\n]}\n");
    std::fclose(json);
  }
  ncclCommDestroy(comm);
  MPI_Finalize();
  return wrongTotal ? 1 : 0;
}

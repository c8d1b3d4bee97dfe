// TensorFlow ops that call Open MPI's collectives on the tensors' own buffers.
//
// Loaded by tfdist/comm/mpi_kernels/__init__.py (built there with g++, TensorFlow's and
// mpicxx's flags) for tfdist/comm/mpi.py's MpiCommunicator. MPI is initialized by mpi4py
// (MPI_THREAD_MULTIPLE) before any of these ops runs, and finalized by it at exit; the ops
// use MPI_COMM_WORLD, the job mpirun (or srun, or horovodrun --mpi) started.
//
// Why compiled: through tf.numpy_function an all-reduce of 23 MB costs three times Open
// MPI's own time, the bridge's copies (experiments/results/mpi4py_in_graph.json).
//
// In place: each op asks TensorFlow to forward its input buffer to its output (possible
// when nothing else reads the input: a fused gradient bucket, a fresh tensor) and then
// calls MPI with MPI_IN_PLACE; otherwise it sums out of place into a new output.
//
// Order: MPI matches collectives on a communicator by their order. These ops are stateful
// and take no resource, so a tf.function's automatic control dependencies run them in
// program order, the same on every rank running the same code; a process-wide mutex keeps
// two threads from calling MPI at once (eager ops of another thread wait their turn).
//
// Errors: MPI_COMM_WORLD returns errors (mpi4py sets MPI_ERRORS_RETURN); an error becomes
// the op's error with MPI's text and this rank. A peer that never calls the matching
// collective is not an error to MPI: tfdist's watchdog (PeerMonitor) bounds that wait.

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"

using namespace tensorflow;  // NOLINT

namespace {

std::mutex& MpiMutex() {
  static std::mutex mutex;
  return mutex;
}

int WorldRank() {
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

Status MpiStatus(int code, const char* call) {
  if (code == MPI_SUCCESS) return OkStatus();
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return errors::Internal("tfdist rank ", WorldRank(), ": ", call, " failed: ",
                          std::string(text, length));
}

Status CheckInitialized() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) {
    return errors::FailedPrecondition(
        "tfdist: MPI is not initialized in this process (or already finalized); the MPI "
        "engine initializes it through mpi4py when its communicator is created");
  }
  return OkStatus();
}

// Sums of 16-bit floats: MPI has no such type, so they travel as MPI_UINT16_T and are
// summed by these user operations, in float32 per element as TensorFlow's own addition is.
template <typename T>
void SumSixteenBit(void* in, void* inout, int* count, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *count; ++i) {
    b[i] = T(static_cast<float>(a[i]) + static_cast<float>(b[i]));
  }
}

MPI_Op SumOp(DataType dtype) {
  static MPI_Op half_sum = MPI_OP_NULL, bfloat16_sum = MPI_OP_NULL;
  if (dtype == DT_HALF) {
    if (half_sum == MPI_OP_NULL) MPI_Op_create(&SumSixteenBit<Eigen::half>, 1, &half_sum);
    return half_sum;
  }
  if (dtype == DT_BFLOAT16) {
    if (bfloat16_sum == MPI_OP_NULL) {
      MPI_Op_create(&SumSixteenBit<Eigen::bfloat16>, 1, &bfloat16_sum);
    }
    return bfloat16_sum;
  }
  return MPI_SUM;
}

Status MpiType(DataType dtype, MPI_Datatype* type) {
  switch (dtype) {
    case DT_FLOAT: *type = MPI_FLOAT; return OkStatus();
    case DT_DOUBLE: *type = MPI_DOUBLE; return OkStatus();
    case DT_INT32: *type = MPI_INT32_T; return OkStatus();
    case DT_INT64: *type = MPI_INT64_T; return OkStatus();
    case DT_HALF: case DT_BFLOAT16: *type = MPI_UINT16_T; return OkStatus();
    default:
      return errors::InvalidArgument("tfdist: the MPI engine sums float16, bfloat16, float32, "
                                     "float64, int32 and int64 tensors; got ",
                                     DataTypeString(dtype));
  }
}

Status CheckCount(int64_t count, const char* what) {
  if (count > INT_MAX) {
    return errors::InvalidArgument("tfdist rank ", WorldRank(), ": ", what, " of ", count,
                                   " elements exceeds MPI's count limit (2^31 - 1)");
  }
  return OkStatus();
}

// The output: the input's own buffer when TensorFlow can forward it, else a new tensor
// (`in_place` says which).
Status ForwardOrAllocate(OpKernelContext* context, Tensor** output, bool* in_place) {
  const Tensor& input = context->input(0);
  TF_RETURN_IF_ERROR(
      context->forward_input_or_allocate_output({0}, 0, input.shape(), output));
  *in_place = (*output)->tensor_data().data() == input.tensor_data().data();
  return OkStatus();
}

}  // namespace

#define TFDIST_SUMMABLE "T: {half, bfloat16, float, double, int32, int64}"
#define TFDIST_ANY_POD \
  "T: {half, bfloat16, float, double, int8, uint8, int16, uint16, int32, uint32, int64, " \
  "uint64, bool}"

REGISTER_OP("TfdistMpiAllreduce")
    .Input("input: T")
    .Output("output: T")
    .Attr(TFDIST_SUMMABLE)
    .SetIsStateful()
    .SetShapeFn(shape_inference::UnchangedShape)
    .Doc("Element-wise sum of `input` over MPI_COMM_WORLD (in place when forwardable).");

class MpiAllreduceOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* context) override {
    OP_REQUIRES_OK(context, CheckInitialized());
    const Tensor& input = context->input(0);
    MPI_Datatype type;
    OP_REQUIRES_OK(context, MpiType(input.dtype(), &type));
    OP_REQUIRES_OK(context, CheckCount(input.NumElements(), "an all-reduce"));
    Tensor* output = nullptr;
    bool in_place = false;
    OP_REQUIRES_OK(context, ForwardOrAllocate(context, &output, &in_place));
    const int count = static_cast<int>(input.NumElements());
    if (count == 0) return;
    void* out = const_cast<char*>(output->tensor_data().data());
    const void* in = in_place ? MPI_IN_PLACE : input.tensor_data().data();
    std::lock_guard<std::mutex> lock(MpiMutex());
    OP_REQUIRES_OK(context, MpiStatus(MPI_Allreduce(in, out, count, type,
                                                    SumOp(input.dtype()), MPI_COMM_WORLD),
                                      "MPI_Allreduce"));
  }
};
REGISTER_KERNEL_BUILDER(Name("TfdistMpiAllreduce").Device(DEVICE_CPU), MpiAllreduceOp);

REGISTER_OP("TfdistMpiReduceScatter")
    .Input("input: T")
    .Output("output: T")
    .Attr(TFDIST_SUMMABLE)
    .Attr("world_size: int")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      int64_t world_size;
      TF_RETURN_IF_ERROR(c->GetAttr("world_size", &world_size));
      shape_inference::DimensionHandle width;
      TF_RETURN_IF_ERROR(c->Divide(c->Dim(c->input(0), 0), world_size, true, &width));
      c->set_output(0, c->Vector(width));
      return OkStatus();
    })
    .Doc("This rank's equal part of the sum over MPI_COMM_WORLD of 1-D `input`.");

class MpiReduceScatterOp : public OpKernel {
 public:
  explicit MpiReduceScatterOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("world_size", &world_size_));
  }
  void Compute(OpKernelContext* context) override {
    OP_REQUIRES_OK(context, CheckInitialized());
    const Tensor& input = context->input(0);
    MPI_Datatype type;
    OP_REQUIRES_OK(context, MpiType(input.dtype(), &type));
    OP_REQUIRES_OK(context, CheckCount(input.NumElements(), "a reduce-scatter"));
    OP_REQUIRES(context, input.dims() == 1 && input.NumElements() % world_size_ == 0,
                errors::InvalidArgument("reduce-scatter takes a 1-D tensor of a multiple of ",
                                        world_size_, " elements; got shape ",
                                        input.shape().DebugString()));
    const int64_t width = input.NumElements() / world_size_;
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({width}), &output));
    if (width == 0) return;
    std::lock_guard<std::mutex> lock(MpiMutex());
    OP_REQUIRES_OK(context,
                   MpiStatus(MPI_Reduce_scatter_block(
                                 input.tensor_data().data(),
                                 const_cast<char*>(output->tensor_data().data()),
                                 static_cast<int>(width), type, SumOp(input.dtype()),
                                 MPI_COMM_WORLD),
                             "MPI_Reduce_scatter_block"));
  }

 private:
  int64_t world_size_;
};
REGISTER_KERNEL_BUILDER(Name("TfdistMpiReduceScatter").Device(DEVICE_CPU), MpiReduceScatterOp);

REGISTER_OP("TfdistMpiAllgather")
    .Input("input: T")
    .Output("output: T")
    .Attr(TFDIST_ANY_POD)
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle rows;
      TF_RETURN_IF_ERROR(c->ReplaceDim(c->input(0), 0, c->UnknownDim(), &rows));
      c->set_output(0, rows);
      return OkStatus();
    })
    .Doc("Every rank's `input` concatenated along axis 0 in rank order (rows may differ).");

class MpiAllgatherOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* context) override {
    OP_REQUIRES_OK(context, CheckInitialized());
    const Tensor& input = context->input(0);
    OP_REQUIRES(context, input.dims() >= 1,
                errors::InvalidArgument("all-gather takes a tensor of rank >= 1; got a scalar"));
    int world_size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    const int64_t rows = input.dim_size(0);
    // The row width (elements after the first dimension) must agree on every rank: it is
    // gathered with the row counts and checked, so a mismatch is an error, not a misread.
    int64_t mine[2] = {rows, input.NumElements() / std::max<int64_t>(rows, 1)};
    if (rows == 0) {
      mine[1] = 1;
      for (int d = 1; d < input.dims(); ++d) mine[1] *= input.dim_size(d);
    }
    std::vector<int64_t> all(2 * world_size);
    std::lock_guard<std::mutex> lock(MpiMutex());
    OP_REQUIRES_OK(context, MpiStatus(MPI_Allgather(mine, 2, MPI_INT64_T, all.data(), 2,
                                                    MPI_INT64_T, MPI_COMM_WORLD),
                                      "MPI_Allgather"));
    std::vector<int> counts(world_size), displacements(world_size);
    int64_t total_rows = 0, offset = 0;
    const int64_t element_bytes = DataTypeSize(input.dtype());
    for (int r = 0; r < world_size; ++r) {
      OP_REQUIRES(context, all[2 * r + 1] == mine[1],
                  errors::InvalidArgument("tfdist rank ", WorldRank(), ": all-gather of rows "
                                          "of ", mine[1], " elements, but rank ", r,
                                          " gives rows of ", all[2 * r + 1]));
      const int64_t bytes = all[2 * r] * mine[1] * element_bytes;
      OP_REQUIRES_OK(context, CheckCount(offset + bytes, "an all-gather's bytes"));
      counts[r] = static_cast<int>(bytes);
      displacements[r] = static_cast<int>(offset);
      offset += bytes;
      total_rows += all[2 * r];
    }
    TensorShape shape = input.shape();
    shape.set_dim(0, total_rows);
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, shape, &output));
    if (offset == 0) return;
    OP_REQUIRES_OK(context,
                   MpiStatus(MPI_Allgatherv(input.tensor_data().data(),
                                            static_cast<int>(input.TotalBytes()), MPI_BYTE,
                                            const_cast<char*>(output->tensor_data().data()),
                                            counts.data(), displacements.data(), MPI_BYTE,
                                            MPI_COMM_WORLD),
                             "MPI_Allgatherv"));
  }
};
REGISTER_KERNEL_BUILDER(Name("TfdistMpiAllgather").Device(DEVICE_CPU), MpiAllgatherOp);

REGISTER_OP("TfdistMpiBroadcast")
    .Input("input: T")
    .Output("output: T")
    .Attr(TFDIST_ANY_POD)
    .Attr("root: int")
    .SetIsStateful()
    .SetShapeFn(shape_inference::UnchangedShape)
    .Doc("Rank `root`'s `input` on every rank (same shape and dtype on every rank).");

class MpiBroadcastOp : public OpKernel {
 public:
  explicit MpiBroadcastOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("root", &root_));
  }
  void Compute(OpKernelContext* context) override {
    OP_REQUIRES_OK(context, CheckInitialized());
    const Tensor& input = context->input(0);
    OP_REQUIRES_OK(context, CheckCount(input.TotalBytes(), "a broadcast's bytes"));
    Tensor* output = nullptr;
    bool in_place = false;
    OP_REQUIRES_OK(context, ForwardOrAllocate(context, &output, &in_place));
    char* out = const_cast<char*>(output->tensor_data().data());
    if (!in_place && input.TotalBytes() > 0) {
      std::memcpy(out, input.tensor_data().data(), input.TotalBytes());
    }
    if (input.TotalBytes() == 0) return;
    std::lock_guard<std::mutex> lock(MpiMutex());
    OP_REQUIRES_OK(context, MpiStatus(MPI_Bcast(out, static_cast<int>(input.TotalBytes()),
                                                MPI_BYTE, root_, MPI_COMM_WORLD),
                                      "MPI_Bcast"));
  }

 private:
  int64_t root_;
};
REGISTER_KERNEL_BUILDER(Name("TfdistMpiBroadcast").Device(DEVICE_CPU), MpiBroadcastOp);

// A TensorFlow op for experiments/mpi4py_in_graph.py: the sum over the MPI world of a float
// tensor, by Open MPI's MPI_Allreduce on the tensor's own buffer (in place when TensorFlow can
// forward the input to the output), without a copy through Python. A measurement, not an
// engine: no timeout, no error naming a rank, one communicator (MPI_COMM_WORLD).
#include <mpi.h>
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

using namespace tensorflow;

REGISTER_OP("MpiAllreduceSum")
    .Input("input: float")
    .Output("output: float")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      return OkStatus();
    });

class MpiAllreduceSumOp : public OpKernel {
 public:
  explicit MpiAllreduceSumOp(OpKernelConstruction* context) : OpKernel(context) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    }
  }
  void Compute(OpKernelContext* context) override {
    const Tensor& input = context->input(0);
    Tensor* output = nullptr;
    OP_REQUIRES_OK(context, context->forward_input_or_allocate_output({0}, 0, input.shape(), &output));
    float* out = output->flat<float>().data();
    const float* in = input.flat<float>().data();
    int n = static_cast<int>(input.NumElements());
    int rc;
    if (out == in) {
      rc = MPI_Allreduce(MPI_IN_PLACE, out, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else {
      rc = MPI_Allreduce(in, out, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    OP_REQUIRES(context, rc == MPI_SUCCESS, errors::Internal("MPI_Allreduce failed"));
  }
};

REGISTER_KERNEL_BUILDER(Name("MpiAllreduceSum").Device(DEVICE_CPU), MpiAllreduceSumOp);

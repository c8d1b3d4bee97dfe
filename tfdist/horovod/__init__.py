"""Horovod's API on tfdist: `import tfdist.horovod.keras as hvd` in a Horovod Keras script.

Horovod's Keras API does not run on Keras 3 or TensorFlow >= 2.16
(horovod#4290). `tfdist.horovod.keras` offers its names, arguments and
semantics - each rank feeds its own data, no strategy scope, gradients
averaged across ranks - on tfdist's engines and Keras 3's own optimizer and
trainer. The modules: `process` (`init`, `rank`, `size`, ...: the job and
its strategy), `engine_queries` (`*_built`, `*_enabled`), `collectives`
(`allreduce`, ...), `compression`, `optimizer` (`DistributedOptimizer`,
`load_model`), `keras` (the public module, Horovod's layout) and
`keras.callbacks`.
"""

"""What tfdist reads of Keras: the declared surface, below everything that uses it.

The bottom of `tfdist.strategies` (beside `inputs`): modules that read Keras
and change nothing, so the step, the state, the modes and the core can ask
about a model without importing the adapter that patches Keras
(`keras_patches`, at the top):

* `keras_internals`: the private Keras names, resolved under each supported
  version's spelling (the only module that imports `keras.src`);
* `patch_points`: every attribute the patch families replace, declared with
  why Keras has no hook there (the families replace only through it);
* `compat`: `check_keras()`, which refuses a Keras outside the supported range
  and verifies at import everything the patches rely on;
* `steps`: which Keras step a function is, and its logs;
* `model_strategy`: what a model's strategy is (the API the callbacks use);
* `fit_session`: the one owner of a running fit's state (`LoopCall`).

`tests/test_structure.py` gives these their own layer: nothing here imports
`keras_patches`, `core`, `modes`, `step` or `state`.
"""

"""TensorFlow for jaxpar's input (tf.data, TFDS) and TensorBoard summaries (`tf.summary`),
imported without Keras.

TensorFlow's `__init__` imports `keras.src.optimizers` at once (to register Keras'
optimizers with SavedModel), which imports Keras and, where scikit-learn is installed (it is:
the bundled digits), scikit-learn through Keras' wrappers: 1.5 s of TensorFlow's 4.3-4.6 s
import (2.7-3.1 s without; 2 cores of an AVX2-only AMD EPYC, TensorFlow 2.21, Keras 3),
paid by every process a run starts — each process of a multi-process run, each Ray actor,
each restart. jaxpar uses neither Keras nor SavedModel, so `tensorflow()` imports TensorFlow
with that one module marked absent (TensorFlow catches the ImportError, as it does where
Keras is not installed) and unmarks it at once: a later `import keras` in the same process
imports it whole, registering the optimizers then (tests/test_data.py). Every import of
TensorFlow in jaxpar goes through here; where TensorFlow is imported already it is returned
as it is. (flax's `metrics.tensorboard` writer would import Keras again, through
TensorBoard's hparams plugin, which subclasses a Keras callback: `jaxpar.metrics` writes
with `tf.summary` itself.)
"""
import importlib
import sys

_KERAS_EAGER = 'keras.src.optimizers'


def tensorflow():
  """The `tensorflow` module, imported (the first time) without Keras.

  tf.data traces the functions it maps with AutoGraph, which converts every call they make:
  the pipeline's helpers call this one, so once TensorFlow is imported it is returned
  without a call into the import system (AutoGraph finds no source for importlib's frozen
  functions and logs a warning to the run's output)."""
  module = sys.modules.get('tensorflow')
  if module is not None and not getattr(module.__spec__, '_initializing', False):
    return module
  if module is None:  # (None also where marked absent: `import` raises)
    marked = _KERAS_EAGER not in sys.modules
    if marked:
      sys.modules[_KERAS_EAGER] = None  # `import` raises ImportError
    try:
      importlib.import_module('tensorflow')
    finally:
      if marked and sys.modules.get(_KERAS_EAGER, False) is None:
        del sys.modules[_KERAS_EAGER]
  # Through the import system, not sys.modules: a thread that finds TensorFlow still being
  # imported by another waits for it to finish.
  return importlib.import_module('tensorflow')


def datasets():
  """The `tensorflow_datasets` module, TensorFlow imported first by `tensorflow()`."""
  tensorflow()
  return importlib.import_module('tensorflow_datasets')

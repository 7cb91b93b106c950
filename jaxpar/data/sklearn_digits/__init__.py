"""The bundled dataset: importing this registers the `sklearn_digits` TFDS builder."""
from jaxpar.data.sklearn_digits.sklearn_digits import SklearnDigits

__all__ = ['SklearnDigits']

"""Input: tfds datasets (including the bundled `sklearn_digits`) and image folders."""

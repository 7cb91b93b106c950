"""scikit-learn's bundled handwritten digits (UCI optdigits test set) as a TFDS dataset.

1,797 real 8×8 grey images of the digits 0–9, shipped inside scikit-learn, so a
run needs no download. Every fifth image (by index) forms the `test` split
(360 images), the rest `train` (1,437). Pixels are 0–16 in the source and are
stored scaled to 0–255; the input pipeline resizes them to the configured size.
"""
import numpy as np
import tensorflow_datasets as tfds


class SklearnDigits(tfds.core.GeneratorBasedBuilder):
  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Initial release.'}

  def _info(self):
    return self.dataset_info_from_configs(
        description=__doc__,
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Image(shape=(8, 8, 1)),
            'label': tfds.features.ClassLabel(num_classes=10),
        }),
        supervised_keys=('image', 'label'),
        homepage='https://archive.ics.uci.edu/dataset/80',
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # the data comes with scikit-learn
    return {'train': self._generate_examples(test=False),
            'test': self._generate_examples(test=True)}

  def _generate_examples(self, test: bool):
    from sklearn.datasets import load_digits  # imported here: only building needs it
    digits = load_digits()
    images = np.round(digits.images * (255 / 16)).astype(np.uint8)[..., None]
    for i, (image, label) in enumerate(zip(images, digits.target)):
      if (i % 5 == 0) == test:
        yield i, {'image': image, 'label': int(label)}

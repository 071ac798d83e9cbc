"""The example trainer (examples/train_digits.py), short version: real digits in, accuracy well above chance out."""

import importlib.util
import os

import pytest

pytestmark = pytest.mark.slow

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "train_digits.py")


@pytest.mark.slow
def test_digits_trainer_quick_run(tmp_path):
    pytest.importorskip("sklearn", reason="scikit-learn (the [test] extra) supplies the digits dataset")
    spec = importlib.util.spec_from_file_location("train_digits", EXAMPLE)
    train_digits = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_digits)
    result = train_digits.main(["--output", str(tmp_path), "--quick", "--direct_num_workers=1"])
    assert result["train_examples"] + result["validation_examples"] == 1797  # every digit built
    assert result["accuracy"] > 0.5  # 10 classes: chance is 0.1

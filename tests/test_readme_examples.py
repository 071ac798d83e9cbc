"""The README's Python examples run as written, in order, in a folder holding `photos/` (class
folders of generated images): the build example publishes OUT, the reading example reads it."""

import contextlib
import io

import pytest

from support.doc_blocks import python_blocks


@pytest.mark.slow
def test_the_readmes_python_examples_run_as_written(tmp_path, monkeypatch):
    from imagerecords.pipeline import example_images

    example_images.write_tree(str(tmp_path / "photos"), per_class=10, broken=False)
    monkeypatch.chdir(tmp_path)
    blocks = python_blocks("README.md")
    assert len(blocks) == 2, "a new README example: give it the folder it needs here"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        for block in blocks:
            exec(compile(block, "README.md", "exec"), {})
    lines = printed.getvalue().splitlines()
    assert lines[0] == "38"  # the train split of the 40 images (split by a hash of each key: 38, not 36)
    # training repeats the split to fill the batch; seed=0 fixes the order, so the labels are known
    assert lines[1:] == ["(256, 224, 224, 3) tf.Tensor([1 0 0 2 0 2 0 0], shape=(8,), dtype=int32)"], lines

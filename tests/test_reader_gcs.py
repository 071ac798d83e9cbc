"""The reader on gs:// paths, through TensorFlow's own GCS file system, against a real GCS emulator."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from support import gcs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.gcs
def test_reader_reads_gs_paths(tmp_path, fake_gcs_server):
    from imagerecords import example_images
    from imagerecords.pipeline import run

    images, local = tmp_path / "images", tmp_path / "ds"
    example_images.write_tree(str(images), per_class=3)
    manifest = run(["--input", str(images), "--output", str(local), "--splits", "train=0.5,validation=0.5",
                    "--num_shards", "2", "--direct_num_workers=1", "--no_progress"])
    emulator = gcs.GcsEmulator(binary=fake_gcs_server).start()
    try:
        emulator.create_bucket("readerbucket")
        for name in sorted(os.listdir(local)):
            emulator.upload(str(local / name), f"gs://readerbucket/ds/{name}")
        env = emulator.env() if callable(emulator.env) else emulator.env
        # A fresh interpreter: TensorFlow reads the GCS settings when its file system first starts.
        code = textwrap.dedent("""
            import json, sys
            from imagerecords import reader
            info = reader.load_info("gs://readerbucket/ds")
            ds = reader.make_dataset("gs://readerbucket/ds", "train", batch_size=2, image_size=16,
                                     config=reader.ReadConfig(with_filename=True))
            names = [n.decode() for _, _, f in ds for n in f.numpy()]
            print(json.dumps({"files": info.splits["train"].files, "names": names}))
        """)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=ROOT,
                             env={**os.environ, **env})
    finally:
        emulator.stop()
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["files"] == [f"gs://readerbucket/ds/{s.filename}" for s in manifest.split("train").shards]
    assert len(result["names"]) == len(set(result["names"])) == manifest.split("train").num_examples

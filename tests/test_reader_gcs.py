"""The reader on gs:// paths, through TensorFlow's own GCS file system, against a real GCS emulator."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from support import gcs

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.gcs
def test_reader_reads_gs_paths(tmp_path, fake_gcs_server):
    from imagerecords.pipeline import example_images
    from imagerecords.cli.launcher import run

    images, local = tmp_path / "images", tmp_path / "ds"
    example_images.write_tree(str(images), per_class=3)
    manifest = run(["--input", str(images), "--output", str(local), "--splits", "train=0.5,validation=0.5",
                    "--num_shards", "2", "--direct_num_workers=1", "--no_progress"])
    emulator = gcs.GcsEmulator(binary=fake_gcs_server).start()
    try:
        emulator.create_bucket("readerbucket")
        train = [s.filename for s in manifest.split("train").shards]
        names = sorted(os.path.relpath(os.path.join(d, f), local) for d, _, files in os.walk(local) for f in files)
        for name in names:  # the version folder's shards too
            emulator.upload(str(local / name), f"gs://readerbucket/ds/{name}")
            # ds2: the same, but train shard 0 holds shard 1's records after its own
            longer = tmp_path / "longer"
            longer.write_bytes((local / name).read_bytes() + ((local / train[1]).read_bytes() if name == train[0] else b""))
            emulator.upload(str(longer), f"gs://readerbucket/ds2/{name}")
        env = emulator.env() if callable(emulator.env) else emulator.env
        # A fresh interpreter: TensorFlow reads the GCS settings when its file system first starts.
        code = textwrap.dedent("""
            import json, sys
            from imagerecords import reader
            info = reader.load_info("gs://readerbucket/ds")
            ds = reader.make_dataset("gs://readerbucket/ds", "train", batch_size=2, image_size=16,
                                     config=reader.ReadConfig(with_filename=True))
            names = [n.decode() for _, _, f in ds for n in f.numpy()]
            stats = reader.ReadStats()
            # A longer shard: "skip" reads up to the count and counts the rest; "fail" refuses it at the call.
            ds = reader.make_dataset("gs://readerbucket/ds2", "train", batch_size=2, image_size=16, stats=stats,
                                     config=reader.ReadConfig(with_filename=True, corrupt_records="skip", cache=True))
            skip_names = [n.decode() for _, _, f in ds for n in f.numpy()]
            try:
                for _ in reader.make_dataset("gs://readerbucket/ds2", "train", batch_size=2, image_size=16,
                                             config=reader.ReadConfig(cache=True)):
                    pass
                error = ""
            except Exception as e:
                error = str(e)
            print(json.dumps({"files": info.splits["train"].files, "names": names, "skip_names": skip_names,
                              "extra": dict(stats.extra), "error": error}))
        """)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=ROOT,
                             env={**os.environ, **env})
    finally:
        emulator.stop()
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["files"] == [f"gs://readerbucket/ds/{s.filename}" for s in manifest.split("train").shards]
    assert len(result["names"]) == len(set(result["names"])) == manifest.split("train").num_examples
    # A longer shard is found on gs:// too, from the object's size; under "skip" its records are counted.
    shard0, shard1 = manifest.split("train").shards[:2]
    assert sorted(result["skip_names"]) == sorted(result["names"])
    assert result["extra"] == {f"gs://readerbucket/ds2/{shard0.filename}": shard1.count}
    assert result["error"].startswith(f"shard gs://readerbucket/ds2/{shard0.filename} is "
                                      f"{shard0.num_bytes + shard1.num_bytes} bytes, manifest.json lists "
                                      f"{shard0.num_bytes}: the file is larger"), result["error"]

"""TensorFlow's start-up lines stay off file descriptor 2; everything else written there gets through."""

from __future__ import annotations

import os
import subprocess
import sys

from slsml.training import quiet

NOISE = ("oneDNN custom operations", "absl::InitializeLog", "cpu_feature_guard")
# Which start-up lines TensorFlow prints depends on the processor (oneDNN is on by default only on some x86
# processors, the CPU-feature guard only where the build lacks an instruction the processor has); with oneDNN
# asked for, TensorFlow prints its oneDNN line on every processor, so each test has a line to keep off.
LOUD = {"TF_ENABLE_ONEDNN_OPTS": "1"}


def stderr_of(code: str, **env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"} | LOUD | env
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=environment)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_importing_tensorflow_after_install_writes_none_of_its_start_up_lines() -> None:
    loud = stderr_of("import tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    assert "oneDNN custom operations" in loud, "TensorFlow no longer says this: the test shows nothing"
    quiet_run = stderr_of(
        "from slsml.training import quiet; quiet.install(); import os, sys; import keras, tensorflow;"
        " print('mine', file=sys.stderr); os.write(2, b'native\\n')"
    )
    assert not any(line in quiet_run for line in NOISE), quiet_run
    assert quiet_run.splitlines()[-2:] == ["mine", "native"]


def test_lines_written_meanwhile_that_are_not_tensorflows_get_through(capfd) -> None:
    with quiet.filtered_stderr():
        os.write(2, b"I0000 00:00:1.0 1 port.cc:153] oneDNN custom operations are on. ...\n")
        os.write(2, b"a warning of someone else's\n")
        os.write(2, b"W0000 cpu_feature_guard.cc:227] This TensorFlow binary is optimized\n")
    assert capfd.readouterr().err == "a warning of someone else's\n"


def test_the_slsml_command_installs_it_before_tensorflow() -> None:
    said = stderr_of(
        "import sys; import slsml.cli.main; from slsml.training import modelio; assert 'tensorflow' in sys.modules;"
        " assert 'sklearn' not in sys.modules, 'Keras imported scikit-learn'"
    )
    assert not any(line in said for line in NOISE), said


def test_keras_imports_without_scikit_learn_after_install_and_scikit_learn_imports_after_it() -> None:
    stderr_of("import sys, keras; assert 'sklearn' in sys.modules, 'Keras no longer imports scikit-learn'")
    stderr_of(
        "import sys; from slsml.training import quiet; quiet.install(); import keras;"
        " assert 'sklearn' not in sys.modules and 'scipy.optimize' not in sys.modules, 'Keras imported scikit-learn';"
        " from sklearn.datasets import load_digits; from scipy.optimize import nnls;"
        " assert load_digits().data.shape == (1797, 64)"
    )

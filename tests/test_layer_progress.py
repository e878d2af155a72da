"""GPTQModel's layer counter, read from the worker's stderr as it arrives, becomes a bar that never overshoots."""

import io
import re

import pytest

from harness import launcher, progress


class Chunked:
    """A stream whose reads end where we say: a pipe hands over whatever has been written so far."""

    def __init__(self, chunks):
        self.chunks = list(chunks)

    def read(self, _size):
        return self.chunks.pop(0) if self.chunks else ""


def gptqmodel_stderr(layers: int, shape: str) -> str:
    """The shapes of GPTQModel 7.6's bars in the demo's gptq.log, redrawn with carriage returns: "bar" with the
    module and a bracketed count, "plain" as CI's log had it ("Quantizing layer 29 of 29`")."""
    last = layers - 1
    text = ""
    for i in range(layers):
        if shape == "plain":
            text += f"\rQuantizing layer {i} of {last}`             "
            continue
        text += f"\rQuantizing layer {i} of {last}             [{i} of {last}] | 0:00:0{i % 10} [{i + 1}/{layers}]"
        text += f"\rQuantizing mlp.down_proj in layer    [{i} of {last}] | 0:00:0{i % 10} [{i + 1}/{layers}]"
    return text + "\n"


def bars(text: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in re.findall(r"quantizing layers \[[#.]*\] (\d+)/(\d+)", text)]


@pytest.mark.parametrize("shape", ["bar", "plain"])
def test_a_read_that_stops_inside_the_layer_count_draws_no_bar(capsys, shape):
    progress.configure()
    text = gptqmodel_stderr(30, shape)
    # Cut every read just after "of 2" (of "of 29"), as the demo's 4,096-character reads once did: 4/3, 6/3, 14/3.
    cuts = [m.end() - 1 for m in re.finditer(r"of 29", text)]
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    log = io.StringIO()
    launcher._relay_stderr(Chunked(chunks), log, "gptq")
    assert log.getvalue() == text
    drawn = bars(capsys.readouterr().err)
    assert drawn and all(total == 30 and done <= total for done, total in drawn), drawn
    assert drawn[-1] == (30, 30)
    assert [done for done, _ in drawn] == sorted(done for done, _ in drawn)

"""GPTQModel's layer counter, read from the worker's stderr as it arrives, becomes a bar that never overshoots."""

import io
import re

from harness import launcher, progress


class Chunked:
    """A stream whose reads end where we say: a pipe hands over whatever has been written so far."""

    def __init__(self, chunks):
        self.chunks = list(chunks)

    def read(self, _size):
        return self.chunks.pop(0) if self.chunks else ""


def gptqmodel_stderr(layers: int) -> str:
    """The shape of GPTQModel 7.6's bars (the demo's gptq.log), redrawn with carriage returns."""
    last = layers - 1
    text = ""
    for i in range(layers):
        text += f"\rQuantizing layer {i} of {last}             [{i} of {last}] | 0:00:0{i % 10} [{i + 1}/{layers}]"
        text += f"\rQuantizing mlp.down_proj in layer    [{i} of {last}] | 0:00:0{i % 10} [{i + 1}/{layers}]"
    return text + "\n"


def bars(text: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in re.findall(r"quantizing layers \[[#.]*\] (\d+)/(\d+)", text)]


def test_a_read_that_stops_inside_the_layer_count_draws_no_bar(capsys):
    progress.configure()
    text = gptqmodel_stderr(30)
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

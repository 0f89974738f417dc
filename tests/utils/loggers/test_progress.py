"""The progress bar's header and text: one column per term of the family's loss, then their total."""

from __future__ import annotations

from utils.loggers.progress import progress_columns, progress_header, progress_text


def test_the_columns_are_the_loss_terms_by_name() -> None:
    assert progress_columns(("box", "obj", "cls")) == ("Epoch", "gpu_mem", "box", "obj", "cls", "total", "labels",
                                                      "img_size")
    header = progress_header(("box", "cls", "dfl", "o2o"))
    assert header.split() == ["Epoch", "gpu_mem", "box", "cls", "dfl", "o2o", "total", "labels", "img_size"]
    assert len(header) == 1 + 10 * 9  # a newline, then 10 characters a column


def test_the_text_has_one_value_per_term_and_their_sum() -> None:
    text = progress_text(3, 10, 0.5, [0.25, 0.125], 32, 64)
    assert text.split() == ["3/9", "0.5G", "0.25", "0.125", "0.375", "32", "64"]
    assert len(progress_text(0, 1, 0.0, [0.1, 0.2, 0.3, 0.4], 1, 64)) == 10 * 9  # aligned under the header


def test_output_that_is_not_a_terminal_gets_one_line_per_phase(capsys) -> None:
    """Under pytest stdout is not a terminal: the bar prints nothing while it runs, then one line."""
    from utils.loggers.progress import PhaseLine, progress_bar

    bar = progress_bar(range(5), 5)
    assert isinstance(bar, PhaseLine)
    for i in bar:
        bar.set_description(f"step {i}", refresh=False)
        assert capsys.readouterr().out == ""
    bar.close()
    bar.close()
    out = capsys.readouterr().out
    assert out.startswith("step 4  5/5 batches in ") and out.endswith("s\n") and out.count("\n") == 1
    quiet = progress_bar(range(2), 2, enabled=False)
    assert list(quiet) == [0, 1] and capsys.readouterr().out == ""

"""Importing a folder of audio plus a table of transcripts (CSV, TSV, Hugging Face audiofolder) as cut manifests."""

from __future__ import annotations

import pytest

from srupp_asr import prepare
from srupp_asr.data import load_cuts
from srupp_asr.errors import UserError
from srupp_asr.prepare import TableColumns, import_table, save_splits, split_path
from tests.test_prepare import _run, write_tone


@pytest.fixture
def audio(tmp_path):
    """Three recordings of known lengths and rates under tmp_path/clips."""
    clips = tmp_path / "clips"
    clips.mkdir()
    write_tone(clips / "a.wav", 1.25)
    write_tone(clips / "b.flac", 0.5, rate=8000)
    write_tone(clips / "c.wav", 2.0, rate=22050)
    return clips


def test_csv_with_quoted_text_and_split_column_gives_one_cut_set_per_split(tmp_path, audio):
    table = tmp_path / "transcripts.csv"
    table.write_text(
        "path,duration_s,speaker,text,split\n"
        'clips/a.wav,99.0,ann,"Hello, World!",train\n'
        "clips/b.flac,0.5,bob,second,dev\n"
        'clips/c.wav,2,ann,"She said ""yes""",train\n'
    )
    problems: list[str] = []
    splits = import_table(table, problems)
    assert problems == []
    assert sorted(splits) == ["dev", "train"]
    train = {c.id: c for c in splits["train"]}
    assert sorted(train) == ["a", "c"]
    assert train["a"].duration == 1.25  # from the audio header, not the table's duration column
    assert (train["c"].duration, train["c"].sampling_rate) == (2.0, 22050)
    sup = train["a"].supervisions[0]
    assert (sup.text, sup.speaker, sup.start, sup.duration) == ("Hello, World!", "ann", 0.0, 1.25)
    assert train["c"].supervisions[0].text == 'She said "yes"'
    (dev,) = splits["dev"]
    assert (dev.id, dev.duration, dev.sampling_rate, dev.supervisions[0].speaker) == ("b", 0.5, 8000, "bob")
    assert dev.load_audio().shape == (1, 4000)


def test_tsv_keeps_quotes_as_text_and_goes_to_the_default_split(tmp_path, audio):
    table = tmp_path / "t.tsv"
    table.write_text('file_name\ttranscription\nclips/a.wav\t"quoted" words\nclips/b.flac\t\n')
    splits = import_table(table, default_split="test")
    assert list(splits) == ["test"]
    texts = {c.id: c.supervisions[0].text for c in splits["test"]}
    assert texts == {"a": '"quoted" words', "b": ""}
    assert all(c.supervisions[0].speaker is None for c in splits["test"])


def test_audiofolder_metadata_csv_and_split_subfolders(tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    write_tone(flat / "x.wav", 0.75)
    (flat / "metadata.csv").write_text("file_name,transcription,speaker_id\nx.wav,one two,s1\n")
    (cut,) = import_table(flat)["all"]
    assert (cut.id, cut.duration, cut.supervisions[0].text, cut.supervisions[0].speaker) == ("x", 0.75, "one two", "s1")

    nested = tmp_path / "nested"
    for split in ("train", "test"):
        (nested / split).mkdir(parents=True)
        write_tone(nested / split / "0001.wav", 0.5 if split == "train" else 1.0)
        (nested / split / "metadata.csv").write_text(f"file_name,text\n0001.wav,{split} words\n")
    splits = import_table(nested)
    assert sorted(splits) == ["test", "train"]
    (test,), (train,) = splits["test"], splits["train"]
    assert (train.duration, train.supervisions[0].text) == (0.5, "train words")
    assert (test.duration, test.supervisions[0].text) == (1.0, "test words")
    assert train.id != test.id  # the same stem in two splits still gives unique cut ids
    (tmp_path / "bare").mkdir()
    with pytest.raises(UserError, match=r"bare: no metadata\.csv"):
        import_table(tmp_path / "bare")


def test_bad_rows_are_skipped_with_one_line_naming_the_table_and_line(tmp_path, audio):
    (tmp_path / "broken.wav").write_bytes(b"RIFF not audio")
    table = tmp_path / "t.csv"
    table.write_text(
        "path,text,split\n"
        "clips/a.wav,fine,train\n"
        "clips/missing.wav,gone,train\n"
        "clips/b.flac,too,many,fields\n"
        ",no path,train\n"
        "clips/c.wav,no split,\n"
        "\n"
        "broken.wav,not audio,train\n"
        "clips/b.flac,bad split,../x\n"
        "clips/a.wav,again,dev\n"
    )
    problems: list[str] = []
    splits = import_table(table, problems)
    assert [c.id for c in splits["train"]] == ["a"] and list(splits) == ["train"]
    assert len(problems) == 7
    expected = [
        (3, "audio file not found"),
        (4, "4 fields, the header has 3"),
        (5, "no audio path in column 'path'"),
        (6, "no split in column 'split'"),
        (8, "cannot read audio"),
        (9, "split '../x' is not a name"),
        (10, "clips/a.wav is listed again (first at"),
    ]
    for problem, (line, why) in zip(problems, expected, strict=True):
        assert problem.startswith(f"{table}:{line}: ") and why in problem and "\n" not in problem


def test_columns_are_found_by_name_or_named_explicitly(tmp_path, audio):
    table = tmp_path / "t.csv"
    table.write_text("clip,words_said,who\nclips/a.wav,hi,me\n")
    with pytest.raises(UserError, match=r"t\.csv: no audio column \(looked for path, file_name"):
        import_table(table)
    (cut,) = import_table(table, columns=TableColumns(audio="clip", text="words_said", speaker="who"))["all"]
    assert (cut.supervisions[0].text, cut.supervisions[0].speaker) == ("hi", "me")
    with pytest.raises(UserError, match="no column 'nope'"):
        import_table(table, columns=TableColumns(audio="nope"))
    with pytest.raises(UserError, match=r"is a \.csv or \.tsv"):
        import_table(tmp_path / "clips" / "a.wav")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(UserError, match=r"empty\.csv: empty"):
        import_table(tmp_path / "empty.csv")


def test_audio_root_overrides_the_tables_folder(tmp_path, audio):
    table = tmp_path / "elsewhere" / "t.tsv"
    table.parent.mkdir()
    table.write_text("path\ttext\na.wav\thi\n")
    (cut,) = import_table(table, audio_root=audio)["all"]
    assert cut.recording.sources[0].source == str(audio / "a.wav")


def test_cli_writes_one_manifest_per_split_that_training_loads(tmp_path, audio, capsys):
    table = tmp_path / "t.csv"
    table.write_text("path,text,speaker,split\nclips/a.wav,One,ann,train\nclips/b.flac,Two,bob,dev\n")
    out = tmp_path / "out"
    assert _run(["prepare", "table", str(table), str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["dev_cuts.jsonl.gz", "train_cuts.jsonl.gz"]
    (train,) = load_cuts(out / "train_cuts.jsonl.gz")  # the check every training and evaluate run makes
    assert (train.id, train.supervisions[0].text) == ("a", "One")
    assert "wrote 2 cuts" in capsys.readouterr().out

    table.write_text("path,text,split\nclips/a.wav,One,train\nclips/gone.wav,Two,train\n")
    assert _run(["prepare", "table", str(table), str(tmp_path / "out2")]) == 1
    assert f"skipped: {table}:3: audio file not found" in capsys.readouterr().err

    table.write_text("path,text\nclips/gone.wav,x\n")
    with pytest.raises(UserError, match="nothing could be imported"):
        _run(["prepare", "table", str(table), str(tmp_path / "out3")])
    assert not (tmp_path / "out3").exists()


def test_a_failed_write_leaves_no_split_half_written(tmp_path, audio, monkeypatch):
    table = tmp_path / "t.csv"
    table.write_text("path,text,split\nclips/a.wav,one,dev\nclips/b.flac,two,train\n")
    splits = import_table(table)
    out = tmp_path / "out"
    out.mkdir()
    split_path(out, "dev").write_text("previous run\n")
    real_save = prepare.save_cuts

    def fail_on_train(cuts, path):
        if "train" in str(path):
            raise OSError(28, "No space left on device", str(path))
        real_save(cuts, path)

    monkeypatch.setattr(prepare, "save_cuts", fail_on_train)
    with pytest.raises(OSError, match="No space left"):
        save_splits(splits, out)
    assert sorted(p.name for p in out.iterdir()) == ["dev_cuts.jsonl.gz"]  # no temporary folder left either
    assert split_path(out, "dev").read_text() == "previous run\n"  # the earlier manifest is untouched

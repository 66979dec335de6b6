"""Scoring ASR output: sclite-compatible WER/CER counts and reports, in pure Python.

- :mod:`~srupp_asr.scoring.align`: the edit-distance alignment with sclite's costs and tie-breaking, and ``Counts``;
- :mod:`~srupp_asr.scoring.formats`: Kaldi ``text``, trn and JSON-lines transcripts;
- :mod:`~srupp_asr.scoring.analysis`: pairing, normalising and aligning a data set, and its breakdowns;
- :mod:`~srupp_asr.scoring.report` / :mod:`~srupp_asr.scoring.plots`: ``results.md``, ``report.html``, PNGs;
- :mod:`~srupp_asr.scoring.score` / :mod:`~srupp_asr.scoring.evaluate`: the ``score`` and ``evaluate`` commands;
- :mod:`~srupp_asr.scoring.summary`: the ``summarize`` command (a recipe's table of scored test sets).
- :mod:`~srupp_asr.scoring.talks`: whole-talk transcripts against the talks' references (the long-form test).
"""

"""CPU inference in numpy, without torch: what ``transcribe`` and ``evaluate`` run by default for float32 on the CPU
(``--engine auto``; :class:`srupp_asr.loading.LoadedModel` chooses).

Each module is the numpy twin of a torch one, tested equal to it: :mod:`.features` (the filterbank and CMVN of
:mod:`srupp_asr.frontend`), :mod:`.sru` and :mod:`.asr` (the SRU++ encoder, subsampling and CTC head), :mod:`.decoder`
(:mod:`srupp_asr.decoder`), :mod:`.lm` (:mod:`srupp_asr.lm`), :mod:`.scorers` and :mod:`.search` (the scorers and
beam search of :mod:`srupp_asr.decoding`), over :mod:`.ops` (linear, layer norm, attention, the search's step
cache) and :mod:`.files` (a directory's weights as numpy arrays, checked as the torch loader checks them).
:mod:`.engine` joins them: :class:`~srupp_asr.runtime.engine.NumpyASR`. Nothing here imports torch.
"""

"""A model directory decoded on the CPU in numpy, torch never imported: :class:`NumpyASR` (the network and the search)
and :func:`load_numpy_lm` (its fusion LM).

Waveforms go the way :func:`srupp_asr.decoding.decode` takes them (the same features, encoder, CTC head, decoder,
scorers and beam search, each the numpy twin of its torch module, tested equal to it), so transcripts are the same
as torch's up to float32 rounding. The runtime runs the SRU++ encoder and the modes ``joint``, ``ctc_greedy`` and
``ctc_prefix_beam`` with an LM (the label-synchronous search); :class:`srupp_asr.loading.LoadedModel` gives any other
model or mode to torch.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from srupp_asr.decoding.alignment import align_hypothesis
from srupp_asr.decoding.lexicon import LexiconScorer, read_word_list
from srupp_asr.decoding.options import DecodingOptions, Hypothesis, unmet_needs
from srupp_asr.errors import UserError, first_line
from srupp_asr.model_files import (
    CONFIG_FILE,
    check_no_pickles,
    check_same_tokenizer,
    read_lm_config,
    read_model_config,
    read_tokenizer,
    weight_files,
)
from srupp_asr.runtime import features
from srupp_asr.runtime.asr import AcousticModel
from srupp_asr.runtime.decoder import TransformerDecoder
from srupp_asr.runtime.files import Unsupported, read_arrays
from srupp_asr.runtime.lm import SRUppLM
from srupp_asr.runtime.ops import Weights, WeightsError
from srupp_asr.runtime.scorers import DecoderScorer, LMScorer
from srupp_asr.runtime.search import CTCPrefixScorer, beam_search
from srupp_asr.threads import one_thread
from srupp_asr.tokenizer import Tokenizer

__all__ = ["NumpyASR", "Unsupported", "load_numpy_lm"]

BLANK_ID = Tokenizer.blank_id
FBANK_BLOCK_FRAMES = 1000  # filterbank frames computed at once (10 s: about 13 MB of framing and FFT)


class NumpyASR:
    """The speech recognition network of a model directory in numpy: features, encoder and CTC head
    (:class:`~srupp_asr.runtime.asr.AcousticModel`) and the attention decoder, with the search over them."""

    device = "cpu"

    def __init__(self, acoustic: AcousticModel, decoder: TransformerDecoder | None, vocab_size: int) -> None:
        self.acoustic, self.decoder, self.vocab_size = acoustic, decoder, vocab_size

    @classmethod
    def load(cls, model_dir: str | os.PathLike[str]) -> tuple[NumpyASR, Tokenizer]:
        """The network and tokenizer of ``model_dir``, read with the checks the torch loader makes (no pickle, the
        config, the tokenizer's size, every weight present, of its shape and finite, none left over); raises
        :class:`Unsupported` for a model this runtime does not run (another encoder, bfloat16 weights)."""
        model_dir = Path(model_dir)
        check_no_pickles(model_dir)
        config = read_model_config(model_dir)["model"]
        config_path = model_dir / CONFIG_FILE
        if config.get("encoder", "srupp") != "srupp":
            raise Unsupported(f"{config_path}: the {config['encoder']} encoder runs with torch only")
        vocab_size = config.get("vocab_size")
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= Tokenizer.sos_eos_id:
            raise UserError(f"{config_path}: bad model settings (vocab_size {vocab_size!r})")
        tokenizer = read_tokenizer(model_dir, vocab_size, f"{CONFIG_FILE} says vocab_size {vocab_size}")
        weights = Weights(read_arrays(model_dir))
        with _building(model_dir, config_path, "model"):
            acoustic = AcousticModel.from_config(config, weights)
            decoder = None
            if config.get("ctc_weight", 0.3) < 1.0:
                decoder_conf = dict(config.get("decoder_conf") or {})
                decoder = TransformerDecoder.from_config(
                    decoder_conf, vocab_size, acoustic.output_size, weights.sub("decoder")
                )
            weights.check_all_taken()
        return cls(acoustic, decoder, vocab_size), tokenizer

    @property
    def frame_shift(self) -> float:
        """Seconds per encoder frame (0.04 s at x4 subsampling)."""
        return self.acoustic.frame_shift

    def runs(self, options: DecodingOptions) -> bool:
        """Whether this runtime decodes with ``options`` (the others go to torch)."""
        return options.mode in ("joint", "ctc_greedy") or (
            options.mode == "ctc_prefix_beam" and options.fusion_weight > 0
        )

    def unmet_needs(self, options: DecodingOptions, lm: SRUppLM | None) -> str | None:
        """Why this model (and ``lm``) cannot decode with ``options``, or None."""
        has_ctc = self.acoustic.has_ctc
        return unmet_needs(options, self.vocab_size, has_ctc, self.decoder is not None, lm.vocab_size if lm else None)

    def decode_waveforms(
        self,
        wavs: Sequence[np.ndarray],
        tokenizer: Tokenizer,
        options: DecodingOptions,
        lm: SRUppLM | None = None,
    ) -> list[Hypothesis]:
        """The best hypothesis of each 16 kHz waveform (float32, 1-D), decoded together as one batch."""
        if not self.runs(options):
            raise ValueError(f"mode {options.mode} runs with torch only")
        feats, frames = self.features(wavs)
        enc, enc_lens = self.acoustic.encode(feats, frames)
        log_probs = self.acoustic.ctc_log_probs(enc) if self.acoustic.has_ctc else None
        if log_probs is not None:  # a NaN (a broken model or input) is an impossible label, as in the search
            log_probs = np.nan_to_num(log_probs, nan=-np.inf, neginf=-np.inf)
        nbests = self._search(enc, enc_lens, log_probs, options, lm if options.fusion_weight > 0 else None)
        shift = self.frame_shift
        hyps = []
        for b, nbest in enumerate(nbests):
            tokens, score = nbest[0]
            frames_b = int(enc_lens[b])
            times, words = align_hypothesis(
                None if log_probs is None else log_probs[b], tokens, tokenizer, shift, frames_b
            )
            hyps.append(Hypothesis(tokens, tokenizer.decode(tokens), score, times, words))
        return hyps

    def features(self, wavs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """The padded ``(B, T, n_mels)`` filterbank of the waveforms and their frame counts, computed one waveform and
        :data:`FBANK_BLOCK_FRAMES` frames at a time (each frame is its own samples' alone): the framing and FFT hold
        about 80 bytes per sample, 105 MB for a batch of eight 10-s pieces at once, 770 MB for a 10-minute chunk."""
        lengths = np.array([w.size for w in wavs], dtype=np.int64)
        frames = features.num_frames(lengths)
        feats = np.zeros((len(wavs), int(frames.max()), self.acoustic.n_mels), np.float32)
        hop, window = features.HOP_LENGTH, features.WIN_LENGTH
        for row, wav, count in zip(feats, wavs, frames.tolist(), strict=True):
            for first in range(0, count, FBANK_BLOCK_FRAMES):
                stop = min(first + FBANK_BLOCK_FRAMES, count)
                piece = wav[first * hop : (stop - 1) * hop + window]
                row[first:stop] = features.fbank(piece[None], np.array([piece.size]), row.shape[-1])[0][0]
        return feats, frames

    def _search(
        self,
        enc: np.ndarray,
        enc_lens: np.ndarray,
        log_probs: np.ndarray | None,
        options: DecodingOptions,
        lm: SRUppLM | None,
    ) -> list[list[tuple[list[int], float]]]:
        """``(tokens, score)`` n-best lists per utterance, as :func:`srupp_asr.decoding.modes._search` makes them."""
        if options.mode == "ctc_greedy":
            path = log_probs.argmax(-1)
            best = np.take_along_axis(log_probs, path[..., None], -1)[..., 0]
            valid = np.arange(best.shape[1])[None, :] < enc_lens[:, None]
            scores = np.where(valid, best, 0.0).sum(1, dtype=np.float32).tolist()
            return [[(_collapse(p[:n]), s)] for p, n, s in zip(path, enc_lens.tolist(), scores, strict=True)]
        ctc_weight = 1.0 if options.mode == "ctc_prefix_beam" else options.ctc_weight
        scorers = []
        if ctc_weight < 1.0:
            scorers.append((DecoderScorer(self.decoder, enc, enc_lens), 1.0 - ctc_weight))
        if ctc_weight > 0.0:
            scorers.append((CTCPrefixScorer(log_probs, enc_lens), ctc_weight))
        if lm is not None:
            scorers.append((LMScorer(lm), options.fusion_weight))
            if lm.word_list is not None and options.word_penalty > 0:
                scorers.append((LexiconScorer(lm.word_list.table()), options.word_penalty))
        if options.maxlen_ratio > 0:
            max_lengths = np.maximum((options.maxlen_ratio * enc_lens.astype(np.float32)).astype(np.int64), 1)
        else:
            max_lengths = enc_lens.astype(np.int64)
        with one_thread():
            return beam_search(
                scorers, enc.shape[0], max_lengths, self.vocab_size, options.beam, options.nbest, options.token_bonus
            )


def _collapse(path: np.ndarray) -> list[int]:
    """The tokens of a CTC path: repeats collapsed, blanks removed."""
    if path.size == 0:
        return []
    keep = np.ones(path.size, dtype=bool)
    keep[1:] = path[1:] != path[:-1]
    ids = path[keep]
    return ids[ids != BLANK_ID].tolist()


def load_numpy_lm(lm_dir: str | os.PathLike[str], tokenizer: Tokenizer) -> SRUppLM:
    """The numpy LM of ``lm_dir``, read with the checks the torch loader makes, its tokenizer checked to be
    ``tokenizer``'s."""
    lm_dir = Path(lm_dir)
    config_path, data = read_lm_config(lm_dir)
    config = data["lm"]
    vocab_size = config.get("vocab_size")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise UserError(f"{config_path}: bad LM settings (vocab_size {vocab_size!r})")
    lm_tokenizer = read_tokenizer(lm_dir, vocab_size, f"the LM {vocab_size}", "an LM directory")
    weights = Weights(read_arrays(lm_dir))
    with _building(lm_dir, config_path, "LM"):
        lm = SRUppLM.from_config(config, weights)
        weights.check_all_taken()
    check_same_tokenizer(lm_tokenizer, tokenizer, lm_dir)
    lm.word_list = read_word_list(lm_dir, tokenizer)
    return lm


@contextlib.contextmanager
def _building(folder: Path, config_path: Path, what: str) -> Iterator[None]:
    """Networks built from ``folder``'s weights by its config: weights that do not fit are a one-line UserError naming
    the weights file, bad settings one naming the config, and what the runtime cannot run :class:`Unsupported`."""
    try:
        yield
    except WeightsError as err:
        raise UserError(f"{weight_files(folder).path}: {err}") from None
    except NotImplementedError as err:
        raise Unsupported(f"{config_path}: {first_line(err)}") from None
    except (TypeError, ValueError, KeyError) as err:
        raise UserError(f"{config_path}: bad {what} settings ({first_line(err)})") from None

"""Plausible wrong implementations of multi-head attention: the suite must reject every one.

Each is the NumPy backend with one mistake, loaded by the tests through
``--backend broken_backends:<NAME>`` exactly as a third-party backend would be. ``EXPECTED`` names
the clause(s) each must fail; the tests assert the suite reports at least one of them as failing.

The backends' classes live in the submodules, one a part of the catalogue (``base``: the two
bases; ``forward`` and ``forward_more``: the NumPy backend's mistakes; ``features``: spec 1.2;
``inputs``: INPUT-1; ``backward``: spec 1.3; ``serving``, ``holes``, ``window_alibi``: spec 1.4);
this module names the instances and the clauses each must fail.
"""

from __future__ import annotations

from .forward import (
    WrongScale, SoftmaxOverQueries, MaskPolarityFlipped, HeadsSplitWrongOrder,
    KeysReshapedWithQueryLength, SilentFloat16, StaleDeviation, StaleDeviationInFloat32,
    ScaleFromDModel, ScaleFromDv, ScaleAfterSoftmax, NoMaxSubtraction, SoftmaxThenMaskRenormalised,
    FiniteMaskValue, FiniteMaskValueZeroRows, MaskFilledWithZero, WeightsBeforeMasking,
    CausalAlignmentSwapped, CausalOffByOne, KeyPaddingOnQueryAxis, BiasIgnored, BiasSubtracted,
    BiasBeforeScaling, LegacyMaskPolarityFlipped, LegacyMaskIgnored, FullyMaskedRowsUniform,
    MaskMeanOfVDeclaredBiasZero, FullyMaskedRowsNaN,
)
from .forward_more import (
    CombineHeadsWithoutTranspose, HeadsAveragedAfterOutputBlocks, MissingOutputBias,
    KeyBiasUsedForQuery, TransposedQueryWeight, OutputProjectionSkipped, SilentBfloat16,
    TF32Rounding, SoftmaxOverBatch, WeightsAveragedOverHeads, BooleanMaskAddedAsMinusInf,
    OutputNanToNum, EmptyKeysRejected, TinyQueriesTreatedAsPadding, Float32Only,
    LegacyOffsetMinus2e9, FusedProjectionWhenKeyIsValue, Float64ThroughFloat32,
    BiasMergedWithFinfoMin, CausalSkippedForOneQuery, KeyPaddingAsFinfoMinBias,
    Float32SoftmaxInFloat64, ValueWidthMustEqualKeyWidth,
)
from .features import (
    SoftcapAfterTheMask, WindowOffByOne, ChunkAsWindow, index_chunks, ChunksFromThePaddedStart,
    ChunkIndexTruncated, AlibiSignFlipped, SegmentsAcrossBatch, CacheOffsetZero,
    LseOfTheUnmaskedRow,
)
from .inputs import (
    QueryDoubledInPlace, QueryWeightScaledThroughView, MaskInvertedInPlace,
    PaddedValuesZeroedInPlace,
)
from .backward import (
    GroupGradientFirstHeadOnly, SoftcapDerivativeDropped, WindowWiderInTheBackward,
    GradientIntoPaddedKeys, DeltaInHalfPrecision, LseCotangentIgnored, LseCotangentRefused,
    SinkAddedToEveryLogit, SinkLeftOutOfTheLse, EmptyRowsNanInTheBackward,
)
from .serving import (
    MergeNanForEmptyStates, MergeBase2AsNatural, MergeSinkInEveryState, PageIndexOffByOne,
    StaleSlotRead, WriteToTheNextSlot,
)
from .holes import (
    QueryScaledInPlaceInTheBackward, SinkIndexedByKvHead, BiasGradientNotReduced, RunToRunNoise,
)
from .window_alibi import (
    WindowRightIgnoredWhenLeftUnbounded, WindowTopLeftWhenBottomRight,
    AlibiPerBatchSlopesOfFirstItem, AlibiSignedDistance,
)

WRONG_SCALE = WrongScale("broken-wrong-scale")
FLOAT32_SOFTMAX_IN_FLOAT64 = Float32SoftmaxInFloat64("broken-float32-in-float64")
VALUE_WIDTH_MUST_EQUAL_KEY_WIDTH = ValueWidthMustEqualKeyWidth("broken-dv-must-equal-dk")
SOFTMAX_OVER_QUERIES = SoftmaxOverQueries("broken-softmax-axis")
MASK_POLARITY_FLIPPED = MaskPolarityFlipped("broken-mask-polarity")
HEADS_SPLIT_WRONG_ORDER = HeadsSplitWrongOrder("broken-head-order")
KEYS_RESHAPED_WITH_QUERY_LENGTH = KeysReshapedWithQueryLength("broken-kv-reshape")
SILENT_FLOAT16 = SilentFloat16("broken-silent-fp16")
SCALE_FROM_D_MODEL = ScaleFromDModel("broken-scale-d-model")
SCALE_FROM_D_V = ScaleFromDv("broken-scale-d-v")
SCALE_AFTER_SOFTMAX = ScaleAfterSoftmax("broken-scale-after-softmax")
NO_MAX_SUBTRACTION = NoMaxSubtraction("broken-no-max-subtraction")
SOFTMAX_THEN_MASK_RENORMALISED = SoftmaxThenMaskRenormalised("broken-mask-after-softmax")
FINITE_MASK_VALUE = FiniteMaskValue("broken-mask-minus-1e4")
FINITE_MASK_VALUE_ZERO_ROWS = FiniteMaskValueZeroRows("broken-mask-minus-1e4-zero-rows")
MASK_FILLED_WITH_ZERO = MaskFilledWithZero("broken-mask-fill-zero")
WEIGHTS_BEFORE_MASKING = WeightsBeforeMasking("broken-weights-unmasked")
CAUSAL_ALIGNMENT_SWAPPED = CausalAlignmentSwapped("broken-causal-alignment")
CAUSAL_OFF_BY_ONE = CausalOffByOne("broken-causal-off-by-one")
KEY_PADDING_ON_QUERY_AXIS = KeyPaddingOnQueryAxis("broken-kpm-query-axis")
BIAS_IGNORED = BiasIgnored("broken-bias-ignored")
BIAS_SUBTRACTED = BiasSubtracted("broken-bias-subtracted")
BIAS_BEFORE_SCALING = BiasBeforeScaling("broken-bias-before-scale")
LEGACY_MASK_POLARITY_FLIPPED = LegacyMaskPolarityFlipped("broken-legacy-polarity")
LEGACY_MASK_IGNORED = LegacyMaskIgnored("broken-legacy-ignored")
FULLY_MASKED_ROWS_UNIFORM = FullyMaskedRowsUniform("broken-masked-rows-uniform")
FULLY_MASKED_ROWS_NAN = FullyMaskedRowsNaN("broken-masked-rows-nan")
MASK_MEAN_OF_V_DECLARED_BIAS_ZERO = MaskMeanOfVDeclaredBiasZero("broken-mask-vs-bias-masked-rows")
COMBINE_HEADS_WITHOUT_TRANSPOSE = CombineHeadsWithoutTranspose("broken-combine-no-transpose")
HEADS_AVERAGED_AFTER_OUTPUT_BLOCKS = HeadsAveragedAfterOutputBlocks("broken-heads-averaged")
MISSING_OUTPUT_BIAS = MissingOutputBias("broken-no-output-bias")
KEY_BIAS_USED_FOR_QUERY = KeyBiasUsedForQuery("broken-q-uses-k-bias")
TRANSPOSED_QUERY_WEIGHT = TransposedQueryWeight("broken-w-q-transposed")
OUTPUT_PROJECTION_SKIPPED = OutputProjectionSkipped("broken-no-output-projection")
SILENT_BFLOAT16 = SilentBfloat16("broken-silent-bf16")
TF32_ROUNDING = TF32Rounding("broken-tf32-rounding")
SOFTMAX_OVER_BATCH = SoftmaxOverBatch("broken-softmax-batch-axis")
WEIGHTS_AVERAGED_OVER_HEADS = WeightsAveragedOverHeads("broken-weights-head-mean")
BOOLEAN_MASK_ADDED_AS_MINUS_INF = BooleanMaskAddedAsMinusInf("broken-mask-added-minus-inf")
OUTPUT_NAN_TO_NUM = OutputNanToNum("broken-nan-to-num")
EMPTY_KEYS_REJECTED = EmptyKeysRejected("broken-empty-keys-raise")
TINY_QUERIES_TREATED_AS_PADDING = TinyQueriesTreatedAsPadding("broken-tiny-queries-padding")
FLOAT32_ONLY = Float32Only("broken-float32-only")
LEGACY_OFFSET_MINUS_2E9 = LegacyOffsetMinus2e9("broken-legacy-minus-2e9")
FUSED_PROJECTION_WHEN_KEY_IS_VALUE = FusedProjectionWhenKeyIsValue("broken-fused-kv-alias")
FLOAT64_THROUGH_FLOAT32 = Float64ThroughFloat32("broken-float64-through-float32")
SOFTCAP_AFTER_THE_MASK = SoftcapAfterTheMask("broken-softcap-after-mask")
WINDOW_OFF_BY_ONE = WindowOffByOne("broken-window-off-by-one")
ALIBI_SIGN_FLIPPED = AlibiSignFlipped("broken-alibi-sign")
CHUNK_AS_WINDOW = ChunkAsWindow("broken-chunk-as-window")
CHUNKS_FROM_THE_PADDED_START = ChunksFromThePaddedStart("broken-chunks-from-padded-start")
CHUNK_INDEX_TRUNCATED = ChunkIndexTruncated("broken-chunk-index-truncated")
SEGMENTS_ACROSS_BATCH = SegmentsAcrossBatch("broken-segments-across-batch")
CACHE_OFFSET_ZERO = CacheOffsetZero("broken-cache-offset-zero")
LSE_OF_THE_UNMASKED_ROW = LseOfTheUnmaskedRow("broken-lse-unmasked")
BIAS_MERGED_WITH_FINFO_MIN = BiasMergedWithFinfoMin("broken-bias-merge-finfo-min")
CAUSAL_SKIPPED_FOR_ONE_QUERY = CausalSkippedForOneQuery("broken-causal-skipped-at-decode")
KEY_PADDING_AS_FINFO_MIN_BIAS = KeyPaddingAsFinfoMinBias("broken-kpm-finfo-min")
STALE_DEVIATION = StaleDeviation("stale-deviation")
STALE_DEVIATION_IN_FLOAT32 = StaleDeviationInFloat32("stale-deviation-float32")

#: attribute -> (backend name, clauses of which at least one must be reported failing)
EXPECTED = {
    "WRONG_SCALE": ("broken-wrong-scale", {"SDPA-1", "SDPA-2", "MHA-1"}),
    "FLOAT32_SOFTMAX_IN_FLOAT64": ("broken-float32-in-float64", {"SDPA-1", "NUM-3", "MHA-1"}),
    "VALUE_WIDTH_MUST_EQUAL_KEY_WIDTH": ("broken-dv-must-equal-dk", {"SDPA-3", "MHA-4"}),
    "SOFTMAX_OVER_QUERIES": ("broken-softmax-axis", {"SDPA-1", "SDPA-4", "MHA-1"}),
    "MASK_POLARITY_FLIPPED": ("broken-mask-polarity", {"MASK-1", "MASK-10", "MASK-11"}),
    "HEADS_SPLIT_WRONG_ORDER": ("broken-head-order", {"HEAD-1", "HEAD-2", "MHA-1", "PARAM-2"}),
    "KEYS_RESHAPED_WITH_QUERY_LENGTH": ("broken-kv-reshape", {"MHA-2", "MHA-4"}),
    "SILENT_FLOAT16": ("broken-silent-fp16", {"NUM-2", "NUM-3", "SDPA-1"}),
    "SCALE_FROM_D_MODEL": ("broken-scale-d-model", {"MHA-1", "MHA-2", "MHA-3", "MHA-4", "MHA-5"}),
    "SCALE_FROM_D_V": ("broken-scale-d-v", {"SDPA-2", "SDPA-3"}),
    "SCALE_AFTER_SOFTMAX": ("broken-scale-after-softmax", {"SDPA-1", "SDPA-2", "SDPA-4"}),
    "NO_MAX_SUBTRACTION": ("broken-no-max-subtraction", {"NUM-4"}),
    "SOFTMAX_THEN_MASK_RENORMALISED": ("broken-mask-after-softmax", {"MASK-1", "MASK-8", "NUM-4"}),
    "FINITE_MASK_VALUE": ("broken-mask-minus-1e4", {"MASK-1", "MASK-9", "NUM-4"}),
    "FINITE_MASK_VALUE_ZERO_ROWS": ("broken-mask-minus-1e4-zero-rows", {"MASK-1"}),
    "MASK_FILLED_WITH_ZERO": ("broken-mask-fill-zero", {"MASK-1", "MASK-5", "MASK-6", "MASK-9"}),
    "WEIGHTS_BEFORE_MASKING": ("broken-weights-unmasked", {"MASK-1", "MASK-9", "SDPA-4"}),
    "CAUSAL_ALIGNMENT_SWAPPED": ("broken-causal-alignment", {"MASK-7"}),
    "CAUSAL_OFF_BY_ONE": ("broken-causal-off-by-one", {"MASK-6", "MASK-7"}),
    "KEY_PADDING_ON_QUERY_AXIS": ("broken-kpm-query-axis", {"MASK-5"}),
    "BIAS_IGNORED": ("broken-bias-ignored", {"MASK-2"}),
    "BIAS_SUBTRACTED": ("broken-bias-subtracted", {"MASK-2"}),
    "BIAS_BEFORE_SCALING": ("broken-bias-before-scale", {"MASK-2"}),
    "LEGACY_MASK_POLARITY_FLIPPED": ("broken-legacy-polarity", {"MASK-3"}),
    "LEGACY_MASK_IGNORED": ("broken-legacy-ignored", {"MASK-3"}),
    "FULLY_MASKED_ROWS_UNIFORM": ("broken-masked-rows-uniform", {"MASK-9"}),
    "FULLY_MASKED_ROWS_NAN": ("broken-masked-rows-nan", {"MASK-9"}),
    "MASK_MEAN_OF_V_DECLARED_BIAS_ZERO": ("broken-mask-vs-bias-masked-rows", {"MASK-11"}),
    "COMBINE_HEADS_WITHOUT_TRANSPOSE": ("broken-combine-no-transpose", {"HEAD-2", "MHA-1"}),
    "HEADS_AVERAGED_AFTER_OUTPUT_BLOCKS": ("broken-heads-averaged", {"MHA-1", "MHA-5"}),
    "MISSING_OUTPUT_BIAS": ("broken-no-output-bias", {"MHA-1", "PARAM-1"}),
    "KEY_BIAS_USED_FOR_QUERY": ("broken-q-uses-k-bias", {"MHA-1", "PARAM-1"}),
    "TRANSPOSED_QUERY_WEIGHT": ("broken-w-q-transposed", {"MHA-1", "PARAM-1"}),
    "OUTPUT_PROJECTION_SKIPPED": ("broken-no-output-projection", {"MHA-1", "PARAM-1"}),
    "SILENT_BFLOAT16": ("broken-silent-bf16", {"NUM-2", "NUM-3", "SDPA-1"}),
    "TF32_ROUNDING": ("broken-tf32-rounding", {"NUM-2", "NUM-3", "SDPA-1"}),
    "SOFTMAX_OVER_BATCH": ("broken-softmax-batch-axis", {"SDPA-1", "SDPA-7"}),
    "WEIGHTS_AVERAGED_OVER_HEADS": ("broken-weights-head-mean", {"MHA-1", "SHAPE-2"}),
    "BOOLEAN_MASK_ADDED_AS_MINUS_INF": ("broken-mask-added-minus-inf", {"MASK-13"}),
    "OUTPUT_NAN_TO_NUM": ("broken-nan-to-num", {"NUM-6"}),
    "EMPTY_KEYS_REJECTED": ("broken-empty-keys-raise", {"SHAPE-4"}),
    "TINY_QUERIES_TREATED_AS_PADDING": ("broken-tiny-queries-padding", {"NUM-5"}),
    "FLOAT32_ONLY": ("broken-float32-only", {"NUM-1"}),
    "LEGACY_OFFSET_MINUS_2E9": ("broken-legacy-minus-2e9", {"MASK-3"}),
    "FUSED_PROJECTION_WHEN_KEY_IS_VALUE": ("broken-fused-kv-alias", {"MHA-3", "MHA-4"}),
    "FLOAT64_THROUGH_FLOAT32": ("broken-float64-through-float32", {"NUM-2"}),
    "SOFTCAP_AFTER_THE_MASK": ("broken-softcap-after-mask", {"SOFTCAP-1"}),
    "WINDOW_OFF_BY_ONE": ("broken-window-off-by-one", {"WIN-1"}),
    "CHUNK_AS_WINDOW": ("broken-chunk-as-window", {"CHUNK-1"}),
    "CHUNKS_FROM_THE_PADDED_START": ("broken-chunks-from-padded-start", {"CHUNK-1"}),
    "CHUNK_INDEX_TRUNCATED": ("broken-chunk-index-truncated", {"CHUNK-1"}),
    "ALIBI_SIGN_FLIPPED": ("broken-alibi-sign", {"ALIBI-1"}),
    "SEGMENTS_ACROSS_BATCH": ("broken-segments-across-batch", {"SEG-1"}),
    "CACHE_OFFSET_ZERO": ("broken-cache-offset-zero", {"CACHE-2"}),
    "LSE_OF_THE_UNMASKED_ROW": ("broken-lse-unmasked", {"LSE-1"}),
    "BIAS_MERGED_WITH_FINFO_MIN": ("broken-bias-merge-finfo-min", {"MASK-9"}),
    "CAUSAL_SKIPPED_FOR_ONE_QUERY": ("broken-causal-skipped-at-decode", {"MASK-6"}),
    "KEY_PADDING_AS_FINFO_MIN_BIAS": ("broken-kpm-finfo-min", {"MASK-9"}),
}


# -- backends that write into the caller's arrays (INPUT-1); their results are right --------------

QUERY_DOUBLED_IN_PLACE = QueryDoubledInPlace("broken-q-doubled-in-place")
QUERY_WEIGHT_SCALED_THROUGH_VIEW = QueryWeightScaledThroughView("broken-w-q-scaled-in-place")
MASK_INVERTED_IN_PLACE = MaskInvertedInPlace("broken-mask-inverted-in-place")
PADDED_VALUES_ZEROED_IN_PLACE = PaddedValuesZeroedInPlace("broken-value-zeroed-in-place")

#: attribute -> (backend name, clauses it must fail): results are right, only INPUT-1 catches them
MODIFIES_INPUTS = {
    "QUERY_DOUBLED_IN_PLACE": ("broken-q-doubled-in-place", {"INPUT-1"}),
    "QUERY_WEIGHT_SCALED_THROUGH_VIEW": ("broken-w-q-scaled-in-place", {"INPUT-1"}),
    "MASK_INVERTED_IN_PLACE": ("broken-mask-inverted-in-place", {"INPUT-1"}),
    "PADDED_VALUES_ZEROED_IN_PLACE": ("broken-value-zeroed-in-place", {"INPUT-1"}),
}


# -- spec 1.3: backward passes and sinks with one mistake each (GRAD-3..9, SINK) ------------------

GROUP_GRADIENT_FIRST_HEAD_ONLY = GroupGradientFirstHeadOnly("broken-gqa-grad-first-head")
SOFTCAP_DERIVATIVE_DROPPED = SoftcapDerivativeDropped("broken-softcap-no-derivative")
WINDOW_WIDER_IN_THE_BACKWARD = WindowWiderInTheBackward("broken-window-backward-off-by-one")
GRADIENT_INTO_PADDED_KEYS = GradientIntoPaddedKeys("broken-grad-into-padded-keys")
DELTA_IN_HALF_PRECISION = DeltaInHalfPrecision("broken-delta-float16")
LSE_COTANGENT_IGNORED = LseCotangentIgnored("broken-dlse-ignored")
SINK_ADDED_TO_EVERY_LOGIT = SinkAddedToEveryLogit("broken-sink-in-numerator")
SINK_LEFT_OUT_OF_THE_LSE = SinkLeftOutOfTheLse("broken-sink-not-in-lse")

EXPECTED.update({
    "GROUP_GRADIENT_FIRST_HEAD_ONLY": ("broken-gqa-grad-first-head", {"GRAD-4"}),
    "SOFTCAP_DERIVATIVE_DROPPED": ("broken-softcap-no-derivative", {"GRAD-5"}),
    "WINDOW_WIDER_IN_THE_BACKWARD": ("broken-window-backward-off-by-one", {"GRAD-6"}),
    "GRADIENT_INTO_PADDED_KEYS": ("broken-grad-into-padded-keys", {"GRAD-7"}),
    "DELTA_IN_HALF_PRECISION": ("broken-delta-float16", {"GRAD-3"}),
    "LSE_COTANGENT_IGNORED": ("broken-dlse-ignored", {"GRAD-8", "GRAD-11"}),
    "SINK_ADDED_TO_EVERY_LOGIT": ("broken-sink-in-numerator", {"SINK-1"}),
    "SINK_LEFT_OUT_OF_THE_LSE": ("broken-sink-not-in-lse", {"SINK-1"}),
})


# -- spec 1.4: merges of partial states with one mistake each (MERGE) -----------------------------

MERGE_NAN_FOR_EMPTY_STATES = MergeNanForEmptyStates("broken-merge-nan-empty")
MERGE_BASE_2_AS_NATURAL = MergeBase2AsNatural("broken-merge-base2-as-natural")
MERGE_SINK_IN_EVERY_STATE = MergeSinkInEveryState("broken-merge-sink-every-state")

EXPECTED.update({
    "MERGE_NAN_FOR_EMPTY_STATES": ("broken-merge-nan-empty", {"MERGE-2"}),
    "MERGE_BASE_2_AS_NATURAL": ("broken-merge-base2-as-natural", {"MERGE-3"}),
    "MERGE_SINK_IN_EVERY_STATE": ("broken-merge-sink-every-state", {"MERGE-4"}),
})


# -- spec 1.4: paged caches with one mistake each (PAGE) -------------------------------------------

PAGE_INDEX_OFF_BY_ONE = PageIndexOffByOne("broken-page-index-off-by-one")
STALE_SLOT_READ = StaleSlotRead("broken-page-stale-slot-read")
WRITE_TO_THE_NEXT_SLOT = WriteToTheNextSlot("broken-page-write-next-slot")

EXPECTED.update({
    "PAGE_INDEX_OFF_BY_ONE": ("broken-page-index-off-by-one", {"PAGE-1"}),
    "STALE_SLOT_READ": ("broken-page-stale-slot-read", {"PAGE-2"}),
    "WRITE_TO_THE_NEXT_SLOT": ("broken-page-write-next-slot", {"PAGE-3"}),
})


# -- spec 1.4: holes of 1.3's suite (INPUT-1 in the backward, grouped sinks, broadcast bias, WIN/ALIBI) -

QUERY_SCALED_IN_PLACE_IN_THE_BACKWARD = QueryScaledInPlaceInTheBackward(
    "broken-vjp-scales-q-in-place")
SINK_INDEXED_BY_KV_HEAD = SinkIndexedByKvHead("broken-sink-by-kv-head")
BIAS_GRADIENT_NOT_REDUCED = BiasGradientNotReduced("broken-d-bias-not-reduced")

#: attribute -> (backend name, clauses it must fail) under the ci profile (spec 1.4's holes)
HOLES_OF_1_3 = {
    "QUERY_SCALED_IN_PLACE_IN_THE_BACKWARD": ("broken-vjp-scales-q-in-place", {"INPUT-1"}),
    "SINK_INDEXED_BY_KV_HEAD": ("broken-sink-by-kv-head", {"SINK-1", "SINK-3"}),
    "BIAS_GRADIENT_NOT_REDUCED": ("broken-d-bias-not-reduced", {"GRAD-9"}),
}


# -- spec 1.4: DET-1 (determinism) -----------------------------------------------------------------

RUN_TO_RUN_NOISE = RunToRunNoise("broken-run-to-run-noise")
HOLES_OF_1_3["RUN_TO_RUN_NOISE"] = ("broken-run-to-run-noise", {"DET-1"})


# -- spec 1.4: window and ALiBi mistakes of kinds real kernels shipped (WIN-1, ALIBI-1) -----------

WINDOW_RIGHT_IGNORED_WHEN_LEFT_UNBOUNDED = WindowRightIgnoredWhenLeftUnbounded(
    "broken-window-left-none-no-window")
WINDOW_TOP_LEFT_WHEN_BOTTOM_RIGHT = WindowTopLeftWhenBottomRight("broken-window-top-left")
ALIBI_PER_BATCH_SLOPES_OF_FIRST_ITEM = AlibiPerBatchSlopesOfFirstItem(
    "broken-alibi-batch-slopes-item-0")
ALIBI_SIGNED_DISTANCE = AlibiSignedDistance("broken-alibi-signed-distance")

#: attribute -> (backend name, clauses it must fail) under the ci profile (spec 1.4's 5f)
WINDOW_AND_ALIBI = {
    "WINDOW_RIGHT_IGNORED_WHEN_LEFT_UNBOUNDED": ("broken-window-left-none-no-window", {"WIN-1"}),
    "WINDOW_TOP_LEFT_WHEN_BOTTOM_RIGHT": ("broken-window-top-left", {"WIN-1"}),
    "ALIBI_PER_BATCH_SLOPES_OF_FIRST_ITEM": ("broken-alibi-batch-slopes-item-0", {"ALIBI-1"}),
    "ALIBI_SIGNED_DISTANCE": ("broken-alibi-signed-distance", {"ALIBI-1"}),
}

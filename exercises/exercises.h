/*
 * exercises.h - the signatures of the seven exercises, in the chapter's order.
 *
 * Every exercise is a function on plain float or byte arrays, row-major, with its
 * shape written next to each pointer, so that it reads beside the chapter's PyTorch
 * module. The conventions are the chapter's (and libattn's):
 *
 *   - a mask is one byte per entry, 1 = "may attend", 0 = "masked";
 *   - a masked score becomes -INFINITY before the softmax, so its weight is exactly 0;
 *   - the softmax runs over the KEY axis (the last one), so each query's row of
 *     weights sums to 1;
 *   - scores are scaled by 1/sqrt(D), D being the head dim of q and k.
 *
 * `make exercises` builds exercises/0N_*.c (your versions) with the grader and says
 * for each one whether it matches libattn's reference, is not written yet, or is
 * wrong, and then which classic mistake it looks like. See docs/exercises.md.
 */
#ifndef ATTN_EXERCISES_H
#define ATTN_EXERCISES_H

#include <stdint.h>

/* 1. Padding mask (exercises/01_padding_mask.c).
 * token_ids [B, T]; mask [B, T, T]: mask[b][i][j] = 1 when query i of sample b may
 * attend to key j, that is when token j of sample b is not pad_id. It is the
 * chapter's [B, 1, 1, T] mask broadcast over the query axis. */
void padding_mask(int B, int T, const int64_t *token_ids /* [B, T] */, int64_t pad_id,
                  uint8_t *mask /* [B, T, T] */);

/* 2. Causal mask (exercises/02_causal_mask.c).
 * mask [T, T]: mask[i][j] = 1 when position i may see position j, i.e. j <= i. */
void causal_mask(int T, uint8_t *mask /* [T, T] */);

/* 3. Masked softmax (exercises/03_masked_softmax.c).
 * weights[i][j] = softmax over j of scores[i][j], where masked scores (mask[i][j]
 * == 0) count as -INFINITY. mask may be NULL (nothing masked). Every row keeps at
 * least one key. */
void masked_softmax(int Tq, int Tk, const float *scores /* [Tq, Tk] */,
                    const uint8_t *mask /* [Tq, Tk] or NULL */,
                    float *weights /* [Tq, Tk] */);

/* 4. Scaled dot-product attention (exercises/04_sdpa.c), one head.
 * scores = q k^T / sqrt(D); masked scores -> -INFINITY; weights = softmax over
 * keys; out = weights v. mask may be NULL; every row keeps at least one key. */
void sdpa(int Tq, int Tk, int D, int Dv, const float *q /* [Tq, D] */,
          const float *k /* [Tk, D] */, const float *v /* [Tk, Dv] */,
          const uint8_t *mask /* [Tq, Tk] or NULL */, float *weights /* [Tq, Tk] */,
          float *out /* [Tq, Dv] */);

/* 5. Head split and merge (exercises/05_heads.c), with E = H * D.
 * split: x [B, T, E] -> heads [B, H, T, D], where head h takes features
 * h*D .. h*D + D - 1 of every position (PyTorch: x.view(B, T, H, D).transpose(1, 2)).
 * merge: the inverse, heads [B, H, T, D] -> x [B, T, E]
 * (PyTorch: heads.transpose(1, 2).reshape(B, T, E)). */
void split_heads(int B, int T, int H, int D, const float *x /* [B, T, H*D] */,
                 float *heads /* [B, H, T, D] */);
void merge_heads(int B, int T, int H, int D, const float *heads /* [B, H, T, D] */,
                 float *x /* [B, T, H*D] */);

/* 6. Stretch: online softmax (exercises/06_online_softmax.c).
 * One query row's weighted sum, computed in a single pass over the keys without
 * keeping the scores: the grader calls online_softmax_init once, then
 * online_softmax_add once per key in order (score = q.k_j / sqrt(D) already
 * computed, -INFINITY for a masked key, and v_j), then online_softmax_result.
 * The result must equal softmax(scores) v; a row whose keys are all masked gives
 * zeros. The state is yours to use: the running max m, the running sum l of
 * exp(score - m), and the accumulator acc of exp(score - m) * v. */
#define ONLINE_MAX_DV 128
typedef struct online_softmax {
    int Dv;                   /* value dim, 1 .. ONLINE_MAX_DV */
    float m;                  /* the largest score seen so far */
    float l;                  /* sum of exp(score - m) over the keys seen */
    float acc[ONLINE_MAX_DV]; /* sum of exp(score - m) * v over the keys seen */
} online_softmax;

void online_softmax_init(online_softmax *st, int Dv);
void online_softmax_add(online_softmax *st, float score, const float *v /* [Dv] */);
void online_softmax_result(const online_softmax *st, float *out /* [Dv] */);

/* 7. Stretch: the backward of one head (exercises/07_sdpa_backward.c), the
 * walkthrough's section 10. With P the forward's weights and dO = dL/dout:
 * 7a. dscores = dS = P o (dP - rowsum(P o dP)), the softmax's backward alone
 *     (o: entrywise; rowsum: over the keys, one number per query row).
 * 7b. dv = P^T dO; dS as in 7a with dP = dO v^T; dq = dS k / sqrt(D);
 *     dk = dS^T q / sqrt(D). weights is the forward's P (0 at a masked key). */
void softmax_backward(int Tq, int Tk, const float *weights /* P [Tq, Tk] */,
                      const float *dweights /* dP [Tq, Tk] */,
                      float *dscores /* dS [Tq, Tk] */);
void sdpa_backward(int Tq, int Tk, int D, int Dv, const float *q /* [Tq, D] */,
                   const float *k /* [Tk, D] */, const float *v /* [Tk, Dv] */,
                   const uint8_t *mask /* [Tq, Tk] or NULL */,
                   const float *weights /* P [Tq, Tk] */, const float *dout /* dO [Tq, Dv] */,
                   float *dq /* [Tq, D] */, float *dk /* [Tk, D] */, float *dv /* [Tk, Dv] */);

#endif /* ATTN_EXERCISES_H */

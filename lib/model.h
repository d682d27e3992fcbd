/* model.h - the description of a transformer model read from GGUF metadata
 * and tensors: architecture, hyper-parameters and one weight per role.
 *
 * Architectures are table-driven (model.c): each supported general.architecture
 * value ("llama", "qwen2", "qwen3", "qwen3moe", "qwen2moe") has one description of which
 * tensors exist, which are optional, which norms apply, the RoPE layout and the
 * MoE routing rule.  One forward pass (engine.c, and each backend) reads the
 * description; no backend branches on the architecture name.
 *
 * Hyper-parameters come from the ARCH.* keys of the GGUF (ARCH = the value of
 * general.architecture), e.g. qwen3moe.embedding_length.  A missing required
 * key or tensor is an error naming it; a tensor with an unexpected shape is an
 * error naming the tensor, its shape and the expected one.
 *
 * Weights are not copied: struct strata_weight points into the GGUF mapping,
 * which must outlive the model.
 */
#ifndef STRATA_MODEL_H
#define STRATA_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

struct strata_gguf;

enum strata_rope_type {
    STRATA_ROPE_NORM = 0, /* rotate pairs (2i, 2i+1): llama */
    STRATA_ROPE_NEOX = 2, /* rotate pairs (i, i + n_rot/2): qwen2/qwen3 */
};

enum strata_rope_scaling {
    STRATA_ROPE_SCALING_NONE = 0,
    STRATA_ROPE_SCALING_LINEAR = 1,
    STRATA_ROPE_SCALING_YARN = 2,
};

/* How router logits become expert weights. */
enum strata_gating {
    STRATA_GATING_SOFTMAX = 1, /* softmax over all experts, then top-k */
    STRATA_GATING_SIGMOID = 2, /* reserved for deepseek-style routers */
};

struct strata_hparams {
    uint32_t n_vocab;
    uint32_t n_ctx_train;   /* ARCH.context_length */
    uint32_t n_embd;        /* ARCH.embedding_length */
    uint32_t n_layer;       /* ARCH.block_count */
    uint32_t n_head;        /* ARCH.attention.head_count */
    uint32_t n_head_kv;     /* ARCH.attention.head_count_kv (default n_head) */
    uint32_t n_embd_head_k; /* ARCH.attention.key_length (default n_embd / n_head) */
    uint32_t n_embd_head_v; /* ARCH.attention.value_length (default n_embd_head_k) */
    uint32_t n_ff;          /* ARCH.feed_forward_length (dense FFN; 0 when none) */
    uint32_t n_expert;      /* ARCH.expert_count (0: dense) */
    uint32_t n_expert_used; /* ARCH.expert_used_count */
    uint32_t n_ff_exp;      /* ARCH.expert_feed_forward_length (from the tensor if absent) */
    uint32_t n_ff_shexp;    /* ARCH.expert_shared_feed_forward_length (qwen2moe) */
    float f_norm_rms_eps;   /* ARCH.attention.layer_norm_rms_epsilon */

    /* RoPE */
    int rope_type;             /* enum strata_rope_type, from the architecture */
    uint32_t n_rot;            /* ARCH.rope.dimension_count (default n_embd_head_k) */
    float rope_freq_base;      /* ARCH.rope.freq_base (default 10000) */
    float rope_freq_scale;     /* 1 / ARCH.rope.scaling.factor (linear and YaRN) */
    int rope_scaling;          /* enum strata_rope_scaling, ARCH.rope.scaling.type */
    uint32_t n_ctx_orig_yarn;  /* ARCH.rope.scaling.original_context_length */
    float yarn_ext_factor;     /* 1 for YaRN (llama.cpp's default), else 0 */
    float yarn_attn_factor;    /* ARCH.rope.scaling.attn_factor (default 1) */
    float yarn_beta_fast;      /* 32, as llama.cpp */
    float yarn_beta_slow;      /* 1 */

    /* MoE routing */
    int expert_gating;         /* enum strata_gating */
    int expert_weights_norm;   /* renormalise the top-k weights to sum 1 */
    float expert_weights_scale;/* multiply the routed sum (default 1) */
};

/* One weight tensor as the forward pass sees it.  data == NULL: absent
 * (an optional tensor the file does not have). */
struct strata_weight {
    const char *name;  /* GGUF tensor name (owned by the GGUF handle) */
    uint32_t type;     /* enum strata_ggml_type */
    int64_t ne[4];     /* ne[0] contiguous (the K dim of a matmul), then rows,
                          then experts: e.g. ffn_gate_exps [n_embd, n_ff_exp, n_expert] */
    size_t nb1;        /* bytes per row */
    size_t nb2;        /* bytes per matrix (one expert) */
    const void *data;  /* inside the GGUF mapping */
};

struct strata_layer {
    struct strata_weight attn_norm;    /* [n_embd] */
    struct strata_weight wq;           /* attn_q   [n_embd, n_head * n_embd_head_k] */
    struct strata_weight wk;           /* attn_k   [n_embd, n_head_kv * n_embd_head_k] */
    struct strata_weight wv;           /* attn_v   [n_embd, n_head_kv * n_embd_head_v] */
    struct strata_weight wo;           /* attn_output [n_head * n_embd_head_v, n_embd] */
    struct strata_weight bq, bk, bv;   /* optional biases (qwen2moe) */
    struct strata_weight attn_q_norm;  /* [n_embd_head_k] qwen3: per-head RMSNorm */
    struct strata_weight attn_k_norm;  /* [n_embd_head_k] */
    struct strata_weight ffn_norm;     /* [n_embd] */

    /* dense FFN (SwiGLU): down(silu(gate x) * up x) */
    struct strata_weight ffn_gate;     /* [n_embd, n_ff] */
    struct strata_weight ffn_up;       /* [n_embd, n_ff] */
    struct strata_weight ffn_down;     /* [n_ff, n_embd] */

    /* routed experts */
    struct strata_weight ffn_gate_inp;  /* router [n_embd, n_expert] */
    struct strata_weight ffn_gate_exps; /* [n_embd, n_ff_exp, n_expert] */
    struct strata_weight ffn_up_exps;   /* [n_embd, n_ff_exp, n_expert] */
    struct strata_weight ffn_down_exps; /* [n_ff_exp, n_embd, n_expert] */

    /* shared expert (qwen2moe): added as sigmoid(gate_inp_shexp . x) * ffn_shexp(x) */
    struct strata_weight ffn_gate_inp_shexp; /* [n_embd] (or [n_embd, 1]) */
    struct strata_weight ffn_gate_shexp;     /* [n_embd, n_ff_shexp] */
    struct strata_weight ffn_up_shexp;       /* [n_embd, n_ff_shexp] */
    struct strata_weight ffn_down_shexp;     /* [n_ff_shexp, n_embd] */

    int is_moe;  /* this layer routes to experts (ffn_gate_inp present) */
};

/* The per-architecture description (model.c's table). */
struct strata_arch {
    const char *name;        /* general.architecture value */
    int rope_type;           /* enum strata_rope_type */
    int has_qk_norm;         /* attn_q_norm / attn_k_norm required */
    int has_qkv_bias;        /* attn_{q,k,v}.bias may exist */
    int moe;                 /* 0 dense only, 1 experts required, 2 either (llama/Mixtral) */
    int has_shexp;           /* shared expert with sigmoid gate (qwen2moe) */
    int expert_weights_norm; /* default when no key says otherwise */
};

struct strata_model {
    const struct strata_gguf *gguf;  /* not owned */
    const struct strata_arch *arch;
    struct strata_hparams hp;
    struct strata_weight tok_embd;    /* token_embd  [n_embd, n_vocab] */
    struct strata_weight output_norm; /* [n_embd] */
    struct strata_weight output;      /* [n_embd, n_vocab]; == tok_embd when tied */
    struct strata_weight rope_freqs;  /* optional [n_rot / 2]: per-pair divisors of the
                                         RoPE frequencies (Llama 3.1 style scaling) */
    struct strata_layer *layers;      /* [n_layer] */
};

/* Read the architecture, hyper-parameters and weights of an open GGUF.
 * *out is owned by the caller (strata_model_free); g must outlive it.
 * Errors: STRATA_E_UNSUPPORTED (an architecture or tensor type this library
 * cannot run; names it), STRATA_E_NOTFOUND (a required key or tensor is
 * missing; names it), STRATA_E_FORMAT (a key of the wrong type or a tensor of
 * the wrong shape; names it), STRATA_E_NOMEM. */
int strata_model_load(struct strata_model **out, const struct strata_gguf *g,
                      struct strata_err *err);

/* NULL is accepted. */
void strata_model_free(struct strata_model *m);

/* The table entry for an architecture name, NULL when unsupported. */
const struct strata_arch *strata_model_find_arch(const char *name);

/* Bytes of weights read per token: dense weights plus n_expert_used experts
 * per MoE layer, plus one row of token_embd.  For the bandwidth floor. */
uint64_t strata_model_active_bytes(const struct strata_model *m);
/* Total bytes of all weights. */
uint64_t strata_model_total_bytes(const struct strata_model *m);

#endif

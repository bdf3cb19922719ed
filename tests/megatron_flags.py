"""A Llama 3 8B pretrain_gpt.py command line that job-config tests extend ({extra})."""

LLAMA3_8B_FLAGS = r"""pretrain_gpt.py --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 \
    --num-attention-heads 32 --group-query-attention --num-query-groups 8 \
    --vocab-size 128256 --swiglu --untie-embeddings-and-output-weights \
    --disable-bias-linear --normalization RMSNorm --position-embedding-type rope \
    --hidden-dropout 0 --attention-dropout 0 --seq-length 4096 \
    --micro-batch-size 1 --global-batch-size 64 --use-distributed-optimizer --bf16 {extra}
"""

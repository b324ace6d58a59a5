import jax
import jax.numpy as jnp


def mlp(params, x):
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    return x @ w + b


def loss(params, x, labels):
    logp = jax.nn.log_softmax(mlp(params, x))
    return -jnp.mean(jnp.sum(logp * labels, axis=-1))


def forward(x, w1, b1, w2, b2):
    return mlp([(w1, b1), (w2, b2)], x)

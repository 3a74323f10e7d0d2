"""``auth.mode: jwt``: HS256 with a secret from the environment, RS256/ES256 from a JWKS served on
a free local port; expiry, issuer, audience, signature and algorithm are all checked, the caller
is ``sub``, and the JWKS is fetched off the event loop, cached, and not refetched per made-up kid."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from test_auth_support import Jwks, auth_client, refused, whoami

from agentkeel.gateway.auth import AuthFailure
from agentkeel.gateway.auth_tokens import LEEWAY_S, JwksKeys

SECRET = "s3cret-" + "x" * 70
ISSUER, AUDIENCE = "https://idp.example", "agentkeel"
HS = {"mode": "jwt", "jwt": {"secret_env": "KEEL_JWT_SECRET", "issuer": ISSUER, "audience": AUDIENCE}}


@pytest.fixture(autouse=True)
def secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEL_JWT_SECRET", SECRET)


def claims(**overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    base = {"sub": "carol", "name": "Carol", "iss": ISSUER, "aud": AUDIENCE, "exp": now + 300, "iat": now,
            "scope": "runs:write admin"}
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_hs256_tokens_are_verified(tmp_path: Path) -> None:
    async with auth_client(tmp_path, HS) as (_runtime, http):
        seen, run = await whoami(http, bearer(jwt.encode(claims(), SECRET, algorithm="HS256")))
        assert seen == "carol" and run["kwargs"]["user"] == "carol"

        async def detail(token: str) -> str:
            response = await http.post("/threads/search", json={}, headers=bearer(token))
            text = refused(response)
            assert 'error="invalid_token"' in response.headers["www-authenticate"]
            return text.lower()

        late = int(time.time()) - int(LEEWAY_S) - 60
        assert "expired" in await detail(jwt.encode(claims(exp=late), SECRET, algorithm="HS256"))
        assert "audience" in await detail(jwt.encode(claims(aud="someone-else"), SECRET, algorithm="HS256"))
        assert "issuer" in await detail(jwt.encode(claims(iss="https://evil.example"), SECRET, algorithm="HS256"))
        assert "signature" in await detail(jwt.encode(claims(), "another-secret-" + "y" * 70, algorithm="HS256"))
        assert "exp" in await detail(jwt.encode(claims(exp=None), SECRET, algorithm="HS256"))
        assert "sub" in await detail(jwt.encode(claims(sub=None), SECRET, algorithm="HS256"))
        assert "not yet valid" in await detail(jwt.encode(claims(nbf=int(time.time()) + 600), SECRET, algorithm="HS256"))
        assert "alg" in await detail(jwt.encode(claims(), SECRET, algorithm="HS512"))  # not configured
        unsigned = jwt.encode(claims(), None, algorithm="none")
        assert "alg" in await detail(unsigned)
        await detail("not.a.jwt")
        await detail("garbage")
        assert "missing bearer token" in refused(await http.post("/threads/search", json={}))
        assert "missing bearer token" in refused(await http.post("/threads/search", json={}, headers={"x-api-key": SECRET}))


def rsa_jwk(kid: str) -> tuple[Any, dict[str, Any]]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)
    return key, {**public, "kid": kid, "use": "sig", "alg": "RS256"}


def ec_jwk(kid: str) -> tuple[Any, dict[str, Any]]:
    key = ec.generate_private_key(ec.SECP256R1())
    public = jwt.algorithms.ECAlgorithm.to_jwk(key.public_key(), as_dict=True)
    return key, {**public, "kid": kid, "use": "sig", "alg": "ES256"}


async def test_jwks_tokens_rs256_and_es256(tmp_path: Path) -> None:
    rsa_key, rsa_public = rsa_jwk("rsa-1")
    ec_key, ec_public = ec_jwk("ec-1")
    stranger, _ = rsa_jwk("rsa-1")  # the same kid, another key: a forged token
    with Jwks().serving() as jwks:
        jwks.keys = [rsa_public, ec_public]
        auth = {"mode": "jwt", "jwt": {"jwks_url": jwks.url, "algorithms": ["RS256", "ES256"], "audience": AUDIENCE}}
        async with auth_client(tmp_path, auth) as (_runtime, http):
            rs = jwt.encode(claims(sub="dave"), rsa_key, algorithm="RS256", headers={"kid": "rsa-1"})
            seen, run = await whoami(http, bearer(rs))
            assert seen == "dave" and run["kwargs"]["user"] == "dave"
            es = jwt.encode(claims(sub="erin"), ec_key, algorithm="ES256", headers={"kid": "ec-1"})
            assert (await whoami(http, bearer(es)))[0] == "erin"
            forged = jwt.encode(claims(sub="dave"), stranger, algorithm="RS256", headers={"kid": "rsa-1"})
            assert "signature" in refused(await http.post("/threads/search", json={}, headers=bearer(forged))).lower()
            hs = jwt.encode(claims(), SECRET, algorithm="HS256", headers={"kid": "rsa-1"})
            assert "alg" in refused(await http.post("/threads/search", json={}, headers=bearer(hs))).lower()
            assert jwks.requests == 1  # cached across requests

            for index in range(10):  # made-up kids, within the refetch cooldown of the first fetch: no fetch
                token = jwt.encode(claims(), rsa_key, algorithm="RS256", headers={"kid": f"made-up-{index}"})
                assert "no key with kid" in refused(await http.post("/threads/search", json={}, headers=bearer(token)))
            assert jwks.requests == 1


async def test_jwks_rotation_outage_and_a_silent_endpoint() -> None:
    old_key, old_public = rsa_jwk("old")
    new_key, new_public = rsa_jwk("new")
    with Jwks().serving() as jwks:
        jwks.keys = [old_public]
        keys = JwksKeys(jwks.url, cooldown_s=0.2, lifespan_s=0.5)
        assert (await keys.key("old")).key_id == "old"
        assert (await keys.key(None)).key_id == "old"  # one key: a token without kid may use it
        jwks.keys = [old_public, new_public]  # the provider rotates
        with pytest.raises(AuthFailure):
            await keys.key("new")  # within the cooldown of the first fetch: not refetched yet
        await asyncio.sleep(0.25)
        assert (await keys.key("new")).key_id == "new"
        with pytest.raises(AuthFailure):
            await keys.key(None)  # two keys now: a kid is needed

        jwks.failing = True
        await asyncio.sleep(0.6)  # the set is stale and the endpoint fails: the known keys go on
        assert (await keys.key("old")).key_id == "old"
        assert jwks.requests >= 3
        assert old_key is not None and new_key is not None

    # Nothing ever fetched: the server cannot check tokens, which is its problem (503), not the caller's.
    dead = JwksKeys(jwks.url)
    with pytest.raises(AuthFailure) as caught:
        await dead.key("old")
    assert caught.value.status == 503 and caught.value.headers == {"Retry-After": "5"}


async def test_a_slow_jwks_does_not_block_the_event_loop(tmp_path: Path) -> None:
    """The (blocking) fetch runs in a thread: the open ``/ok`` is answered while it waits."""
    key, public = rsa_jwk("k")
    with Jwks().serving() as jwks:
        jwks.keys, jwks.delay_s = [public], 0.6
        async with auth_client(tmp_path, {"mode": "jwt", "jwt": {"jwks_url": jwks.url}}) as (_runtime, http):
            token = jwt.encode(claims(aud=None), key, algorithm="RS256", headers={"kid": "k"})
            begin = time.monotonic()
            search = asyncio.create_task(http.post("/threads/search", json={}, headers=bearer(token)))
            await asyncio.sleep(0.15)  # the search is waiting for the JWKS by now
            assert (await http.get("/ok")).status_code == 200
            assert time.monotonic() - begin < 0.45 and not search.done()
            assert (await search).status_code == 200

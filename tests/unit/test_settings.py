"""Settings: defaults < YAML < env < flags; every problem listed with its path."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from extender.settings import Settings, SettingsError, describe, leaf_paths, load_settings


def test_defaults_are_valid_and_leaf_names_unique() -> None:
    assert Settings().validate() == []
    paths = leaf_paths()
    assert paths["telemetry_ttl_s"] == ("policy", "telemetry_ttl_s")
    assert paths["bind"] == ("server", "bind")


def test_yaml_nested_and_flat_then_env_then_overrides(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("policy:\n  telemetry_ttl_s: 12\n  namespace_criticality_ceilings: {prod: critical}\n"
                      "usage_margin: 1.3\nno_kube: true\n")
    env = {"DEEPRES_TELEMETRY_TTL_S": "20", "DEEPRES_THREADS": "4", "OTHER": "x"}
    settings = load_settings(str(config), env=env, overrides={"bind": "127.0.0.1:9999", "log_level": None})
    assert settings.policy.telemetry_ttl_s == 20.0
    assert settings.policy.usage_margin == 1.3
    assert settings.kube.no_kube is True
    assert settings.server.threads == 4 and settings.server.bind == "127.0.0.1:9999"
    assert settings.policy.ceiling("prod") == 3 and settings.policy.ceiling("dev") == 2
    assert settings.policy.params().telemetry_ttl_s == 20.0


def test_every_problem_is_listed_with_its_path(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("policy:\n  usage_margin: 0.5\n  bogus: 1\nfragmentation_weight: 1.5\nnope: 2\n")
    env = {"DEEPRES_THREADS": "many", "DEEPRES_BIND": "nowhere", "DEEPRES_DEFAULT_CRITICALITY_CEILING": "max"}
    with pytest.raises(SettingsError) as err:
        load_settings(str(config), env=env)
    text = "\n".join(err.value.problems)
    for expected in ("policy.usage_margin must be in [1, 10], got 0.5", "policy.bogus: unknown setting",
                     "policy.fragmentation_weight must be in [0, 1], got 1.5", "nope: unknown setting",
                     "DEEPRES_THREADS: must be a whole number, got 'many'", "server.bind must be HOST:PORT",
                     "policy.default_criticality_ceiling must be one of low, normal, high, critical"):
        assert expected in text


def test_tls_pair_and_token_file_checked(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(env={"DEEPRES_TLS_CERT": str(tmp_path / "missing.pem"),
                           "DEEPRES_TELEMETRY_TOKEN_FILE": str(tmp_path / "none")})
    text = "\n".join(err.value.problems)
    assert "tls_cert and server.tls_key must be given together" in text
    assert "telemetry.telemetry_token_file must be a readable file" in text


def test_token_never_logged(tmp_path: Path) -> None:
    token = tmp_path / "t"
    token.write_text("  abc \n")
    settings = load_settings(env={"DEEPRES_TELEMETRY_TOKEN_FILE": str(token), "DEEPRES_TELEMETRY_TOKEN": "zzz"})
    assert settings.telemetry_token_value() == "abc"
    assert "zzz" not in describe(settings) and "telemetry_token=<set>" in describe(settings)


def test_bad_yaml_is_one_clear_problem(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("- a list\n")
    with pytest.raises(SettingsError, match="must be a mapping"):
        load_settings(str(config), env={})


def test_serve_flags_override_everything_and_gunicorn_runs_one_threaded_worker(tmp_path: Path) -> None:
    import argparse

    from extender.cli import UsageError
    from extender.server.serve import add_arguments, gunicorn_options, settings_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("x")
    key.write_text("y")
    args = parser.parse_args(["--bind", "127.0.0.1:9000", "--no-kube", "--threads", "3", "--tls-cert", str(cert),
                              "--tls-key", str(key), "--log-level", "debug"])
    settings = settings_from_args(args)
    assert settings.kube.no_kube and settings.server.bind == "127.0.0.1:9000"
    options = gunicorn_options(settings)
    assert options["workers"] == 1 and options["threads"] == 3
    # gthread, with new connections waiting for a first byte on the poller (issue 26)
    from gunicorn.workers.gthread import ThreadWorker

    from extender.server.gunicorn_worker import ThreadWorker as IdleSafe

    assert options["worker_class"] == "extender.server.gunicorn_worker.ThreadWorker"
    assert issubclass(IdleSafe, ThreadWorker)
    assert options["certfile"] == str(cert) and options["keyfile"] == str(key) and not options["preload_app"]
    with pytest.raises(UsageError, match=r"server\.bind must be HOST:PORT"):
        settings_from_args(parser.parse_args(["--bind", "nowhere"]))


def test_granian_runs_one_worker_with_the_configured_threads_and_tls(tmp_path: Path) -> None:
    import argparse

    from granian.constants import Interfaces

    from extender.server.serve import GranianServer, add_arguments, granian_options, make_server, settings_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("x")
    key.write_text("y")
    settings = settings_from_args(parser.parse_args(["--bind", "127.0.0.1:9001", "--threads", "5", "--tls-cert",
                                                     str(cert), "--tls-key", str(key)]))
    assert settings.server.engine == "granian" and isinstance(make_server(settings), GranianServer)
    options = granian_options(settings)
    assert (options["address"], options["port"]) == ("127.0.0.1", 9001)
    # the request threads are the RSGI bridge's pool (extender/server/rsgi.py); granian's own thread runs the event loop
    assert options["workers"] == 1 and options["blocking_threads"] == 1 and options["interface"] == Interfaces.RSGI
    assert options["ssl_cert"] == cert and options["ssl_key"] == key
    # HTTP/1.1 only: granian's HTTP/2 detection waits for a first byte with no deadline (issue 26)
    assert options["http"] == "1" and options["backpressure"] == settings.server.max_connections
    assert options["http1_settings"].header_read_timeout == settings.server.header_timeout_s * 1000
    gunicorn = settings_from_args(parser.parse_args(["--engine", "gunicorn"]))
    assert not isinstance(make_server(gunicorn), GranianServer)


def test_mtls_verbs_need_a_client_ca_a_certificate_and_a_listener_that_checks_it(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(None, env={"DEEPRES_VERBS_ACCESS": "mtls"})
    assert any("needs server.tls_client_ca and a certificate" in p for p in info.value.problems)
    assert any("needs server.scheduler_bind" in p and "engine=gunicorn" in p for p in info.value.problems)
    with pytest.raises(SettingsError, match="verbs_access must be one of loopback, mtls, any"):
        load_settings(None, env={"DEEPRES_VERBS_ACCESS": "everyone"})
    pem = tmp_path / "x.pem"
    pem.write_text("x")
    ok = load_settings(None, env={"DEEPRES_VERBS_ACCESS": "mtls", "DEEPRES_ENGINE": "gunicorn",
                                  "DEEPRES_TLS_CERT": str(pem), "DEEPRES_TLS_KEY": str(pem),
                                  "DEEPRES_TLS_CLIENT_CA": str(pem)})
    from extender.server.serve import gunicorn_options

    assert gunicorn_options(ok)["ca_certs"] == str(pem) and gunicorn_options(ok)["cert_reqs"] == ssl.CERT_OPTIONAL
    assert Settings().server.verbs_access == "loopback"
    # granian with the scheduler's own listener, which checks the certificate in its handshake (issue 34)
    listener = load_settings(None, env={"DEEPRES_VERBS_ACCESS": "mtls", "DEEPRES_SCHEDULER_BIND": "127.0.0.1:8889",
                                        "DEEPRES_SCHEDULER_TLS_CERT": str(pem), "DEEPRES_SCHEDULER_TLS_KEY": str(pem),
                                        "DEEPRES_TLS_CLIENT_CA": str(pem)})
    assert listener.server.engine == "granian" and not listener.server.tls_cert
    with pytest.raises(SettingsError, match=r"scheduler_bind must differ from server\.bind"):
        load_settings(None, env={"DEEPRES_SCHEDULER_BIND": "0.0.0.0:8888"})


def test_an_unknown_engine_is_refused_with_the_choices() -> None:
    with pytest.raises(SettingsError, match=r"server\.engine must be one of granian, gunicorn, got 'uwsgi'"):
        load_settings(None, env={"DEEPRES_ENGINE": "uwsgi"})


def test_the_worker_keeps_freed_memory_on_glibc() -> None:
    import platform

    from extender.server.serve import keep_freed_memory

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt is glibc's; elsewhere the worker keeps the C library's defaults")
    assert keep_freed_memory() is True


def test_namespace_share_floors_take_numbers_from_yaml_and_refuse_what_is_not_one(tmp_path: Path) -> None:
    """`policy.namespace_gpu_share_floors` is a mapping of numbers: a YAML config's 0.0 is read as 0.0 (it was
    refused as "not a mapping of strings"), a word or a value outside [0, 1] is refused naming the key."""
    config = tmp_path / "settings.yaml"
    config.write_text("policy:\n  namespace_gpu_share_floors:\n    research: 0.0\n    shared: 0.5\n")
    policy = load_settings(config_file=str(config), env={}).policy
    assert policy.share_floor("research") == 0.0 and policy.share_floor("shared") == 0.5
    assert policy.share_floor("elsewhere") == 1.0
    for bad in ("{research: lots}", "{research: 2}"):
        with pytest.raises(SettingsError, match=r"(?i)namespace_gpu_share_floors"):
            load_settings(env={"DEEPRES_NAMESPACE_GPU_SHARE_FLOORS": bad})

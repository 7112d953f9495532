"""What packaging copies of a user's project folder: not its local secrets, and nothing a
link would bring in from outside it."""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path

import pytest

from agentscope_serverless.errors import PackagingError
from agentscope_serverless.packaging.project import (
    check_archivable,
    copy_project,
    project_requirements,
    secrets_left_out,
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "agent.py").write_text("app = 1\n")
    (root / "pkg" / "data").mkdir()
    (root / "pkg" / "data" / "table.csv").write_text("a,b\n")
    for name in (".env", ".env.local", ".env.production"):
        (root / name).write_text("OPENAI_API_KEY=sk-secret\n")
    (root / "pkg" / ".env.test").write_text("TOKEN=secret\n")
    (root / "app.env").write_text("OPENAI_API_KEY=sk-secret\n")  # a Compose env_file
    (root / ".envrc").write_text("export OPENAI_API_KEY=sk-secret\n")  # direnv's
    (root / "README.md").write_text("hi\n")
    (root / "tests").mkdir()  # the project's tests, as `init` lays them out
    (root / "tests" / "test_agent.py").write_text("def test(): pass\n")
    (root / "conftest.py").write_text("")
    (root / "pytest.ini").write_text("[pytest]\ntestpaths = tests\n")  # `init` writes it
    (root / "tox.ini").write_text("[tox]\nenv_list = py312\n")
    return root


def copied(target: Path) -> set[str]:
    return {str(p.relative_to(target)) for p in target.rglob("*") if p.is_file()}


def test_dotenv_files_and_tests_stay_out_and_links_inside_the_project_are_copied(
    project: Path, tmp_path: Path
) -> None:
    (project / "pkg" / "alias.py").symlink_to("agent.py")
    (project / "tables").symlink_to(project / "pkg" / "data", target_is_directory=True)
    target = tmp_path / "out"
    target.mkdir()
    copy_project(project, target)
    assert copied(target) == {
        "README.md",
        "pkg/agent.py",
        "pkg/alias.py",
        "pkg/data/table.csv",
        "tables/table.csv",
    }
    assert (target / "pkg" / "alias.py").read_text() == "app = 1\n"


PRIVATE_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAA=\n"
AWS_SECRET = "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n"


def test_credentials_and_private_keys_stay_out_and_are_named(project: Path, tmp_path: Path) -> None:
    """A project run from a home folder, or holding a copy of the developer's credentials,
    had them archived, readable by any user."""
    secrets = {
        ".aws/credentials": "[default]\naws_secret_access_key = wJalr\n",
        ".ssh/id_ed25519": PRIVATE_KEY,
        ".kube/config": "token: t\n",
        ".netrc": "machine pypi login me password pw\n",
        ".npmrc": "//registry.npmjs.org/:_authToken=t\n",
        ".pypirc": "[pypi]\npassword = pw\n",
        ".git-credentials": "https://me:pw@github.com\n",
        ".docker/config.json": '{"auths": {}}\n',
        ".streamlit/secrets.toml": 'OPENAI_API_KEY = "sk-secret"\n',
        "pkg/tls/client.key": f"Bag Attributes\n{PRIVATE_KEY}",
        "pkg/deploy_key": PRIVATE_KEY,
        # Credentials files of any name, in their tools' formats.
        "prod-aws.ini": f"[prod]\naws_access_key_id = AKIAEXAMPLE\n{AWS_SECRET}",
        "secrets/aws": f"[default]\n{AWS_SECRET}",
        "pkg/ops.vars": "AWS_SECRET_ACCESS_KEY='wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY'\n",
        "pkg/client.json": '{"web": {"client_id": "1", "client_secret": "GOCSPX-abcdefghijk"}}',
    }
    kept = {
        "pkg/aws_files.py": f'"""Reads a credentials file:\n\n[default]\n{AWS_SECRET}"""\n',
        "pkg/template.ini": "[default]\naws_secret_access_key = ${AWS_SECRET_ACCESS_KEY}\n",
        "pkg/schema.json": '{"client_secret": "", "private_key": "<your key>"}\n',
        ".streamlit/config.toml": "[theme]\n",  # Streamlit's settings, not its secrets
        "pkg/tls/ca.pem": "-----BEGIN CERTIFICATE-----\nMIIB\n",  # a CA the agent trusts
        "pkg/config.json": "{}\n",
    }
    for name, text in {**secrets, **kept}.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    target = tmp_path / "out"
    target.mkdir()
    copy_project(project, target)
    assert copied(target) == {"README.md", "pkg/agent.py", "pkg/data/table.csv", *kept}
    assert secrets_left_out(project) == [
        ".aws/",
        ".docker/config.json",
        ".env",
        ".env.local",
        ".env.production",
        ".envrc",
        ".git-credentials",
        ".kube/",
        ".netrc",
        ".npmrc",
        ".pypirc",
        ".ssh/",
        ".streamlit/secrets.toml",
        "app.env",
        "pkg/.env.test",
        "pkg/client.json",
        "pkg/deploy_key",
        "pkg/ops.vars",
        "pkg/tls/client.key",
        "prod-aws.ini",
        "secrets/aws",
    ]


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_link_to_outside_the_project_is_refused(project: Path, tmp_path: Path, kind: str) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
    if kind == "file":
        (project / "pkg" / "key").symlink_to(home / ".ssh" / "id_ed25519")
        where = "pkg/key"
    else:
        (project / "pkg" / "ssh").symlink_to(home / ".ssh", target_is_directory=True)
        where = "pkg/ssh"
    target = tmp_path / "out"
    target.mkdir()
    with pytest.raises(PackagingError, match=f"{where} links outside the project folder"):
        copy_project(project, target)
    assert copied(target) == set()


def test_a_link_left_out_anyway_is_not_refused(project: Path, tmp_path: Path) -> None:
    os.symlink(tmp_path, project / ".venv")  # a virtualenv kept elsewhere
    target = tmp_path / "out"
    target.mkdir()
    copy_project(project, target)
    assert "pkg/agent.py" in copied(target)


@pytest.mark.parametrize("cycle", ["ancestor", "mutual"])
def test_links_that_loop_are_refused(project: Path, tmp_path: Path, cycle: str) -> None:
    if cycle == "ancestor":
        (project / "pkg" / "up").symlink_to(project, target_is_directory=True)
    else:
        (project / "a").mkdir()
        (project / "a" / "to_b").symlink_to(project / "b", target_is_directory=True)
        (project / "b").mkdir()
        (project / "b" / "to_a").symlink_to(project / "a", target_is_directory=True)
    target = tmp_path / "out"
    target.mkdir()
    with pytest.raises(PackagingError, match="links back to a folder holding it"):
        copy_project(project, target)


@pytest.mark.parametrize(
    ("link", "points_to", "said"),
    [
        ("pkg/notes.txt", "drafts/notes.txt", "links to drafts/notes.txt, which does not exist"),
        ("pkg/self", "self", "is a link that leads back to itself through links, to no file"),
    ],
)
def test_a_link_to_nothing_is_refused_naming_it(
    project: Path, tmp_path: Path, link: str, points_to: str, said: str
) -> None:
    # The copy crashed on it with a traceback (FileNotFoundError, RuntimeError).
    (project / link).symlink_to(points_to)
    target = tmp_path / "out"
    target.mkdir()
    with pytest.raises(PackagingError, match=f"^{re.escape(link)} {re.escape(said)}"):
        copy_project(project, target)


def test_a_copy_into_the_project_leaves_itself_and_the_outputs_named_out(
    project: Path,
) -> None:
    # A build whose output folder is inside the project (`--out artifacts/`), holding an
    # archive of an earlier build.
    artifacts = project / "artifacts"
    artifacts.mkdir()
    (artifacts / "earlier-agentrun.zip").write_bytes(b"PK")
    target = artifacts / "agentrun"
    target.mkdir()
    copy_project(project, target, leave_out=[artifacts])
    assert copied(target) == {"README.md", "pkg/agent.py", "pkg/data/table.csv"}


def test_leaving_out_the_project_folder_itself_leaves_out_nothing(
    project: Path, tmp_path: Path
) -> None:
    target = tmp_path / "out"
    target.mkdir()
    copy_project(project, target, leave_out=[project])  # `--out .`
    assert "pkg/agent.py" in copied(target)


def test_archives_of_earlier_builds_are_not_copied_as_the_projects_code(
    project: Path, tmp_path: Path
) -> None:
    # `deploy agentrun --out artifacts/` and `deploy modelstudio --out .`, then `deploy sam
    # build` (which knows neither folder): the layer would carry both archives.
    (project / "artifacts").mkdir()
    (project / "artifacts" / "shop-agentrun.zip").write_bytes(b"PK")
    (project / "agentscope-serverless-modelstudio.zip").write_bytes(b"PK")
    (project / "pkg" / "data" / "rates.zip").write_bytes(b"PK")  # the agent's own data
    target = tmp_path / "out"
    target.mkdir()
    copy_project(project, target)
    assert copied(target) == {
        "README.md",
        "pkg/agent.py",
        "pkg/data/table.csv",
        "pkg/data/rates.zip",
    }


@pytest.mark.parametrize(
    ("encoding", "bom"),
    [("utf-8", b""), ("utf-8", b"\xef\xbb\xbf"), ("utf-16", b""), ("utf-32", b"")],
)
def test_requirements_saved_by_windows_editors_are_read(
    project: Path, encoding: str, bom: bytes
) -> None:
    # Notepad's UTF-8 with a BOM, PowerShell's `echo humanize > requirements.txt` (UTF-16)...
    requirements = project / "requirements.txt"
    requirements.write_bytes(bom + "# sizes\r\n\r\n".encode(encoding))
    assert project_requirements(project) is None  # nothing required
    requirements.write_bytes(bom + "humanize  # sizes\r\n".encode(encoding))
    assert project_requirements(project) == requirements


def test_requirements_that_are_no_text_are_refused_naming_the_file(project: Path) -> None:
    (project / "requirements.txt").write_bytes("humanize  # tama\xf1o\n".encode("latin-1"))
    with pytest.raises(PackagingError, match=r"requirements\.txt is not UTF-8 .*save it as UTF-8"):
        project_requirements(project)


@pytest.mark.parametrize("name", ["env", "myenv", ".virtualenv"])
def test_a_virtualenv_of_any_name_is_left_out(project: Path, tmp_path: Path, name: str) -> None:
    # `python -m venv env` in the project: its python links to the system's.
    venv = project / name
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "bin" / "python").symlink_to("/usr/bin/python3")
    (venv / "lib").mkdir()
    (venv / "lib" / "big.so").write_bytes(b"\0" * 1024)
    target = tmp_path / "out"
    target.mkdir()
    copy_project(project, target)
    assert copied(target) == {"README.md", "pkg/agent.py", "pkg/data/table.csv"}


def test_a_conda_environment_in_the_project_is_left_out(project: Path, tmp_path: Path) -> None:
    # `conda create -p ./env`: its interpreter and packages (hundreds of MB) were archived.
    env = project / "env"
    (env / "conda-meta").mkdir(parents=True)
    (env / "conda-meta" / "history").write_text("==> 2026-01-01 <==\n")
    (env / "bin").mkdir()
    (env / "bin" / "python3.11").write_bytes(b"\x7fELF")
    (env / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    (env / "lib" / "python3.11" / "site-packages" / "numpy.py").write_text("")
    target = tmp_path / "out"
    target.mkdir()
    copy_project(project, target)
    assert copied(target) == {"README.md", "pkg/agent.py", "pkg/data/table.csv"}


@pytest.mark.parametrize(
    ("link", "points_to"), [("pkg/settings.txt", "../.env"), ("pkg/keys", "../.venv")]
)
def test_a_link_to_what_packaging_leaves_out_is_refused(
    project: Path, tmp_path: Path, link: str, points_to: str
) -> None:
    # The copy followed it: the secrets of .env were archived as pkg/settings.txt.
    (project / ".venv").mkdir()
    (project / link).symlink_to(points_to)
    target = tmp_path / "out"
    target.mkdir()
    with pytest.raises(PackagingError, match=f"^{re.escape(link)} links to .*, which packaging"):
        copy_project(project, target)
    assert copied(target) == set()


def test_a_src_layout_project_has_its_packages_copied_to_the_top(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "src" / "mypkg").mkdir(parents=True)
    (project / "pyproject.toml").write_text('[project]\nname = "mypkg"\n')
    (project / "src" / "mypkg" / "__init__.py").write_text("")
    (project / "src" / "mypkg.egg-info").mkdir()
    target = tmp_path / "out"
    target.mkdir()
    assert sorted(copy_project(project, target)) == ["mypkg", "pyproject.toml"]
    assert copied(target) == {"mypkg/__init__.py", "pyproject.toml"}


def test_a_src_folder_that_is_a_package_is_copied_as_it_is(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "pyproject.toml").write_text('[project]\nname = "app"\n')
    (project / "src" / "__init__.py").write_text("")
    target = tmp_path / "out"
    target.mkdir()
    copy_project(project, target)
    assert copied(target) == {"src/__init__.py", "pyproject.toml"}


def test_a_src_layout_package_named_as_a_top_level_entry_is_refused(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "src" / "mypkg").mkdir(parents=True)
    (project / "mypkg").mkdir()
    (project / "setup.py").write_text("")
    target = tmp_path / "out"
    target.mkdir()
    with pytest.raises(PackagingError, match=r"mypkg is both in src/ and at its root"):
        copy_project(project, target)
    assert copied(target) == set()


# Keys as their issuers give them (made up, of the right form).
OPENAI_KEY = "sk-proj-" + "Ab3dEfGh1jKlMn0pQrStUvWx" * 2
GITHUB_TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0" * 2
KEY_FORMS = {
    "OpenAI's": OPENAI_KEY,
    "Anthropic's": "sk-ant-api03-" + "x1Y2z3" * 8,
    "GitHub's": GITHUB_TOKEN,
    "GitHub's fine-grained": "github_pat_11ABCDEFG0" + "a1b2c3d4" * 6,
    "Slack's": "xoxb-1234567890-0987654321-AbCdEfGhIjKlMnOpQrStUvWx",
    "an AWS access key's": "AKIAZ5QWERTY7Q2WXYZB",
    "Google's": "AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",
    "Hugging Face's": "hf_" + "aBcDeFgHiJ" * 4,
}


def test_api_keys_and_tokens_in_data_files_stay_out_and_are_named(
    project: Path, tmp_path: Path
) -> None:
    """An API key's JSON, a config assigning OPENAI_API_KEY, a token file were archived; the
    build named .env alone."""
    secrets = {
        "keys.json": f'{{"api_key": "{OPENAI_KEY}"}}\n',
        "settings.cfg": f"[llm]\nOPENAI_API_KEY={OPENAI_KEY}\n",
        "tokens.txt": f"GITHUB_TOKEN={GITHUB_TOKEN}\n",
        "pkg/app.yaml": "model: qwen-max\ntoken: 3f9a1c0b7e2d4a6f8b1c9d0e\n",
        "pkg/web.json": '{"apiKey": "a1b2c3d4e5f6a7b8c9d0"}\n',
        "pkg/db.toml": 'password = "Zq8vR3nL0pW5tY2u"\n',
        "pkg/notes.md": f"Mine: `{GITHUB_TOKEN}`\n",  # prose, but the key is a key
        "run.sh": f"export OPENAI_API_KEY={OPENAI_KEY}\n",
        **{f"pkg/forms/{n}.txt": f"{key}\n" for n, key in enumerate(KEY_FORMS.values())},
    }
    kept = {
        "pkg/template.yaml": "api_key: ${OPENAI_API_KEY}\ntoken: <your token>\n",
        "pkg/prompts.json": '{"max_tokens": 1024, "token": "", "api_key": "your-api-key-here"}\n',
        "pkg/secret_ref.yaml": "secret: arn:aws:secretsmanager:us-east-1:123456789012:secret:x\n",
        "pkg/usage.md": "Set `OPENAI_API_KEY=sk-...` in the platform's environment.\n",
        "pkg/setup.sh": 'export OPENAI_API_KEY="$OPENAI_API_KEY"\n',
        # A path, a URL, a secret's name in its store, an environment reference, a name
        # that only ends as a secret's, placeholders: no key.
        "pkg/routes.json": '{"login": "/api/v1/login", "password": "/api/v1/users/password"}\n',
        "pkg/oauth_routes.yaml": "endpoints:\n  token: /oauth2/v1/token\n",
        "pkg/litellm.yaml": "model_list:\n  - api_key: os.environ/AZURE_API_KEY_EU2\n",
        "pkg/gcp.yaml": "secret: projects/my-agent-123/secrets/openai-key/versions/latest\n",
        "pkg/aws_secret.yaml": "llm:\n  secret: prod/agent/openai-2024\n",
        "pkg/page.json": '{"kind": "youtube#list", "nextPageToken": "CAUQAA2024abcdefgh"}\n',
        "pkg/tokenizer.json": '{"unk_token": "token_0000000000", "model_token": "gpt-4o-2024"}',
        "pkg/fr.json": '{"password": "Mot de passe 1er"}\n',
        "pkg/aws_cli.md": "AWS Access Key ID [None]: AKIAIOSFODNN7EXAMPLE\n",
        "pkg/keys.txt": "Yours: sk-proj-XXXXXXXXXXXXXXXXXXXX1234\nsk-test-0000000000000000",
        "pkg/dummy.cfg": "API_TOKEN=dummy-0123456789abcdef\n",
        "pkg/marked.txt": f"{OPENAI_KEY}  # pragma: allowlist secret\n",
    }
    assert_left_out(project, tmp_path, secrets, kept)


def test_passwords_holding_punctuation_stay_out_and_are_named(
    project: Path, tmp_path: Path
) -> None:
    """A config's password of 16 characters or more with a digit was archived, unnamed, when
    it held common punctuation (``#``, ``$``, ``@``, ``!``, ``&``)."""
    secrets = {
        "config/db.ini": "[db]\npassword = Xk9#mP2$vL8@qR5!zT\n",
        "config/prod.vars": "DB_PASSWORD=Tr0ub4dor&3horse!!\n",
        "config/db.yaml": 'db:\n  password: "Sup3r!S3cret#2024"\n',
        "config/commented.ini": "[db]\npassword = Xk9#mP2$vL8@qR5!zT  ; the production one\n",
        "config/single.yaml": "password: 'Sup3r!S3cret#2024' # rotated in March\n",
        "config/keys.json": '{"api_key": "Ab3$dE6^gH9*jK2~mN5", "user": "bot"}\n',
    }
    kept = {
        # References to a secret kept elsewhere, text with spaces, placeholders: no secret.
        "config/ref.yaml": 'password: "${DB_PASSWORD}"\ntoken: $GITHUB_TOKEN_FOR_CI_2024\n',
        "config/interpolated.ini": "[db]\npassword = %(db_password_2024)s\n",
        "config/vault.yaml": "password: '{{ vault_db_password_2024 }}'\n",
        "config/sentence.yaml": 'password: "Sup3r S3cret 2024, said twice!"\n',
        "config/code.cfg": 'api_key = os.environ["OPENAI_API_KEY_2"]\n',
        "config/sample.ini": "password = changeme#Changeme2024!\n",
        "config/path.yaml": "token: /run/secrets/db-password-2024!\n",
    }
    assert_left_out(project, tmp_path, secrets, kept)


def test_secret_settings_of_every_spelling_stay_out_and_are_named(
    project: Path, tmp_path: Path
) -> None:
    """A password under a dotted name (Spring's), in lower snake or kebab case, or in camel
    case was archived, unnamed: only upper-snake names and a few of their own were known."""
    password = "Xk9#mP2$vL8@qR5!zT"
    secrets = {
        "config/application.properties": f"spring.datasource.password={password}\n",
        "config/app.yaml": f"db:\n  db_password: {password}\n",
        "config/smtp.toml": f'smtp-password = "{password}"\n',
        "config/web.json": f'{{"user": "bot", "dbPassword": "{password}"}}\n',
        "config/oauth.json": f'{{"clientSecret": "{password}"}}\n',
        "config/aws.yaml": f"aws:\n  secretKey: {password}\n",
        "config/gh.json": f'{{"githubAccessToken": "{password}"}}\n',
        "config/Settings.json": f'{{"DbPassword": "{password}"}}\n',
    }
    kept = {
        # Names that only end as a secret's, or only begin so: no secret.
        "config/tokenizer.json": '{"tokenizer.pad_token": "token_0000000000"}\n',
        "config/paging.json": f'{{"nextPageToken": "{password}"}}\n',
        "config/hint.yaml": f"passwordHint: {password}\n",
        "config/names.yaml": f"secret_name: {password}\nsecretName: {password}\n",
    }
    assert_left_out(project, tmp_path, secrets, kept)


def assert_left_out(
    project: Path, tmp_path: Path, secrets: dict[str, str], kept: dict[str, str]
) -> None:
    """Write ``secrets`` and ``kept`` into ``project``: its copy leaves out the first and
    keeps the others, and the build names the first alone."""
    for name, text in {**secrets, **kept}.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    target = tmp_path / "out"
    target.mkdir()
    copy_project(project, target)
    assert copied(target) == {"README.md", "pkg/agent.py", "pkg/data/table.csv", *kept}
    named = set(secrets_left_out(project))
    assert set(secrets) <= named
    assert not [p for p in named if p in kept]


def test_kubeconfigs_putty_keys_and_docker_logins_stay_out_and_are_named(
    project: Path, tmp_path: Path
) -> None:
    """A kubeconfig with its client key, a PuTTY key, a copy of Docker's logins were
    archived, readable by any user, unnamed."""
    key_data = base64.b64encode(PRIVATE_KEY.encode()).decode()
    certificate = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0t" * 40
    secrets = {
        "kubeconfig.yaml": "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n"
        f"    certificate-authority-data: {certificate}\nusers:\n- name: admin\n  user:\n"
        f"    client-certificate-data: {certificate}\n    client-key-data: {key_data}\n",
        "pkg/kube.json": f'{{"users": [{{"user": {{"client-key-data": "{key_data}"}}}}]}}\n',
        "server.ppk": "PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\n"
        "Private-Lines: 1\nAAAAIBt9s8d7f6g5h4j3k2l1\n",
        "docker-auth.json": '{"auths": {"ghcr.io": {"auth": "Ym9iOmdocF9hYmNkZWZnaGlqaw=="}}}',
    }
    kept = {
        "pkg/cluster.yaml": f"- cluster:\n    certificate-authority-data: {certificate}\n",
        "pkg/registry.json": '{"auths": {"ghcr.io": {}}, "credsStore": "desktop"}\n',
        "pkg/kube.md": "Your kubeconfig names `client-key-data: <base64 of your key>`.\n",
    }
    assert_left_out(project, tmp_path, secrets, kept)


def test_configs_holding_a_url_with_its_password_stay_out_and_are_named(
    project: Path, tmp_path: Path
) -> None:
    """A config naming its database by a URL with the password in it was archived, readable
    by any user, unnamed."""
    secrets = {
        "config.yaml": "database_url: postgresql://app:s3cr3t-2024@db.internal:5432/app\n",
        "pkg/settings.toml": 'cache = "redis://:pa55word99@cache.internal:6379/0"\n',
        "pkg/broker.json": '{"broker": "amqp://bot:p%40ssw0rd7@mq.internal/agents"}\n',
    }
    kept = {
        "pkg/local.yaml": "database_url: postgresql://postgres:postgres@localhost/app\n",
        "pkg/prod.yaml": "database_url: postgresql://app:${DB_PASSWORD}@db.internal/app\n",
        "pkg/template.ini": "url = postgresql://app:<password>@db.internal/app\n"
        "other = postgresql://app:%(password)s@db.internal/app\n",
        "pkg/links.yaml": "docs: https://user@github.com/org/repo\nhost: http://db:8080/x\n",
        "pkg/marked.yaml": "url: redis://:s3cr3t-2024@cache/0  # pragma: allowlist secret\n",
        "pkg/guide.md": "Set `postgresql://app:s3cr3t-2024@db.internal/app` as yours.\n",
    }
    assert_left_out(project, tmp_path, secrets, kept)


@pytest.mark.parametrize(
    "code",
    [
        f'OPENAI_API_KEY = "{OPENAI_KEY}"\n',
        'GITHUB: str = "' + GITHUB_TOKEN + '"\n',
        "# export OPENAI_API_KEY=" + OPENAI_KEY + "\n",
        f'os.environ["OPENAI_API_KEY"] = "{OPENAI_KEY}"\n',
        'KEY = "-----BEGIN RSA PRIVATE KEY-----\\nMIIB"\n',
    ],
)
def test_a_module_holding_a_key_fails_the_copy_naming_its_file_and_line(
    project: Path, tmp_path: Path, code: str
) -> None:
    # Left out, the agent could not import it; copied, the key went with the archive.
    (project / "pkg" / "llm.py").write_text(f'"""The model."""\n\nimport os\n\n{code}')
    target = tmp_path / "out"
    target.mkdir()
    with pytest.raises(PackagingError) as refused:
        copy_project(project, target)
    message = str(refused.value)
    assert message.startswith("pkg/llm.py (line 5) holds what looks like a secret ("), message
    assert "os.environ" in message
    for secret in (OPENAI_KEY, GITHUB_TOKEN, "MIIB"):
        assert secret not in message
    assert message.endswith("is let through by # pragma: allowlist secret on its line")
    assert copied(target) == set()


def test_a_module_reading_its_keys_from_elsewhere_is_copied(project: Path, tmp_path: Path) -> None:
    code = (
        "import os\n\n"
        'OPENAI_API_KEY = os.environ["OPENAI_API_KEY"]\n'
        'token = os.getenv("GITHUB_TOKEN", "")\n'
        "client = dict(api_key=settings.openai_api_key_v2, max_tokens=1024)\n"
        'api_key: str = ""\n'
        'API_KEY_ENV = "OPENAI_API_KEY"\n'
        'password = "<set me>"\n'
        'if token == "a1b2c3d4e5f6a7b8c9d0e1f2":\n    pass\n'
        '"""Set OPENAI_API_KEY=sk-... before serving."""\n'
        # A secret's name, path or URL given to a secret's name, and placeholders.
        'client = dict(model="qwen", api_key="a1b2c3d4e5f6a7b8c9d0e1f2")\n'
        'HEADERS = {"token": "3f9a1c0b7e2d4a6f8b1c9d0e"}\n'
        'OPENAI_SECRET = "prod/agent/openai-2024"\n'
        'GCP_SECRET = "projects/my-agent-123/secrets/openai-key/versions/latest"\n'
        'private_key = "certs/agent-signing-2048.pem"\n'
        'ENDPOINTS = {"token": "/oauth2/v1/token"}\n'
        'MODEL_LIST = [{"api_key": "os.environ/AZURE_API_KEY_EU2"}]\n'
        'SAMPLE = {"nextPageToken": "CAUQAA2024abcdefgh"}\n'
        '# e.g. api_key="abcd1234efgh5678ijkl" -- never do this\n'
        'FAKE_KEY = "sk-test-0000000000000000"\n'
        'AWS_DOCS = "AKIAIOSFODNN7EXAMPLE"\n'
        'SHOWN = "sk-proj-XXXXXXXXXXXXXXXXXXXX1234"\n'
        f'KNOWN = "{OPENAI_KEY}"  # pragma: allowlist secret\n'
    )
    (project / "pkg" / "llm.py").write_text(code)
    target = tmp_path / "out"
    target.mkdir()
    copy_project(project, target)
    assert (target / "pkg" / "llm.py").read_text() == code


@pytest.mark.parametrize(
    ("entry", "module"),
    [("secrets.py", "secrets"), ("uuid.py", "uuid"), ("token.py", "token"), ("json", "json")],
)
def test_a_module_named_as_the_standard_librarys_is_refused_naming_it(
    project: Path, tmp_path: Path, entry: str, module: str
) -> None:
    # Deployed, the project comes ahead of the standard library: starlette's `from secrets
    # import token_hex` got the project's secrets.py, and the app could not start.
    if entry.endswith(".py"):
        (project / entry).write_text("def helper():\n    return 1\n")
    else:
        (project / entry).mkdir()
        (project / entry / "__init__.py").write_text("")
    shown = entry if entry.endswith(".py") else f"{entry}/"
    target = tmp_path / "out"
    target.mkdir()
    for step in (lambda: check_archivable(project), lambda: copy_project(project, target)):
        with pytest.raises(PackagingError) as refused:
            step()
        assert str(refused.value).startswith(
            f"the project's {shown} hides the standard library's module {module}: deployed, "
        ), refused.value
        assert str(refused.value).endswith("rename the project's")
    assert copied(target) == set()


@pytest.mark.parametrize("entry", ["chunk.py", "statistics.py", "profile.py", "code", "site"])
def test_a_module_named_as_a_standard_one_the_runtime_never_imports_is_copied(
    project: Path, tmp_path: Path, entry: str
) -> None:
    # The build refused them, and an archive holding them started and answered: only a
    # module the runtime imports as it starts (secrets, json) is hidden by the project's.
    name = entry if entry.endswith(".py") else f"{entry}/__init__.py"
    (project / name).parent.mkdir(parents=True, exist_ok=True)
    (project / name).write_text("def helper():\n    return 1\n")
    target = tmp_path / "out"
    target.mkdir()
    check_archivable(project)
    copy_project(project, target)
    assert name in copied(target)


def test_test_modules_beside_the_code_are_left_out(project: Path, tmp_path: Path) -> None:
    # Their fixtures' made-up keys failed the build; no function runs them.
    (project / "pkg" / "test_llm.py").write_text(f'KEY = "{OPENAI_KEY}"\n')
    (project / "pkg" / "llm_test.py").write_text("def test(): pass\n")
    (project / "pkg" / "testing.py").write_text("X = 1\n")
    target = tmp_path / "out"
    target.mkdir()
    copy_project(project, target)
    assert copied(target) == {"README.md", "pkg/agent.py", "pkg/data/table.csv", "pkg/testing.py"}


def test_a_folder_named_as_a_standard_module_but_no_package_is_copied(
    project: Path, tmp_path: Path
) -> None:
    # A folder without __init__.py comes after the standard library's package on the path.
    (project / "html").mkdir()
    (project / "html" / "index.html").write_text("<p>hi</p>\n")
    target = tmp_path / "out"
    target.mkdir()
    copy_project(project, target)
    assert "html/index.html" in copied(target)


@pytest.mark.parametrize("entry", ["agentscope_serverless", "agentscope_serverless.py"])
def test_an_entry_named_as_the_runtimes_package_is_refused_naming_it(
    project: Path, tmp_path: Path, entry: str
) -> None:
    # The folder was left out without a word; the module was copied, hidden by the runtime.
    if entry.endswith(".py"):
        (project / entry).write_text("X = 1\n")
    else:
        (project / entry).mkdir()
        (project / entry / "my_extension.py").write_text("X = 1\n")
    shown = entry if entry.endswith(".py") else f"{entry}/"
    target = tmp_path / "out"
    target.mkdir()
    for step in (lambda: check_archivable(project), lambda: copy_project(project, target)):
        with pytest.raises(PackagingError) as refused:
            step()
        assert str(refused.value) == (
            f"the project's {shown} is named as the runtime's own package, which every "
            "package of the project holds: one would hide or overwrite the other; rename the "
            "project's"
        )
    assert copied(target) == set()

from tests.extender.support import client, make_app, profiles_file  # noqa: F401  (fixtures)

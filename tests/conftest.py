from tests.neo4j_fixture import *  # noqa

// tests/test_main.cpp — the one Boost.Test main every suite links.
#define BOOST_TEST_MODULE mixtape
#include <boost/test/unit_test.hpp>

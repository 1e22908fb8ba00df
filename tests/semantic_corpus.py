"""Short English documents on unrelated topics, and near duplicates of some of them at the
level semantic dedup is for: whitespace, punctuation and case changed, or one word changed
for one of like meaning. MiniLM scores each near duplicate 0.96 or more against its
original, and any two originals 0.6 or less (``tests/stages/text/test_semantic_dedup.py``
checks both)."""

from __future__ import annotations

ORIGINALS = [
    "The city museum opens at nine in the morning on weekdays. Admission is free for children "
    "under twelve, and guided tours leave from the main hall every hour.",
    "The river floods almost every spring when the snow in the mountains melts. Farmers in "
    "the valley have built earth walls to protect their fields from the water.",
    "To bake the bread, mix the flour, water, salt and yeast, then knead the dough for ten "
    "minutes. Let it rise for an hour before shaping the loaf and baking it in a hot oven.",
    "The home team scored twice in the second half and won the match three to one. Their "
    "goalkeeper saved a penalty in the final minutes to keep the lead.",
    "Python lists are ordered and mutable. You can append items, remove them by value, and "
    "sort the list in place with its sort method.",
    "Voters in the region went to the polls on Sunday to choose a new parliament. Turnout "
    "was higher than at the last election, according to early figures.",
    "Heavy rain is expected across the north tomorrow, with strong winds along the coast. "
    "Temperatures will stay below average until the weekend.",
    "The new phone has a larger screen, a faster processor and a battery that lasts two "
    "days. It goes on sale next month in three colours.",
    "Honey bees communicate the location of flowers through a waggle dance performed inside "
    "the hive. The angle of the dance points other workers towards the food.",
    "The central bank raised interest rates by a quarter of a point to slow inflation. "
    "Mortgage payments are likely to rise for millions of households.",
    "The violinist practised the concerto for six hours a day before the premiere. Critics "
    "praised her tone in the slow movement.",
    "Volcanic eruptions release ash and sulphur dioxide high into the atmosphere, which can "
    "cool the planet for a year or two after a large eruption.",
    "The hospital opened a new wing for children with cancer. It has twenty beds, a "
    "playroom and rooms where parents can stay overnight.",
    "Medieval castles were built on hills or beside rivers so that they were easier to "
    "defend. Thick stone walls and a moat kept attackers away.",
    "Regular exercise lowers blood pressure and improves sleep. Doctors recommend at least "
    "thirty minutes of brisk walking on most days.",
    "The train to the airport leaves every fifteen minutes from platform four. Tickets are "
    "cheaper if you buy them before you board.",
    "Octopuses can change the colour and texture of their skin in a fraction of a second to "
    "hide from predators on the sea floor.",
    "The company reported record profits for the third quarter, driven by strong sales of "
    "its cloud software to large businesses.",
    "Tomatoes need plenty of sun and regular watering. Tie the stems to a cane as they grow "
    "and pinch out the side shoots.",
    "The library will close for renovation in March. Borrowed books can be returned to the "
    "branch on the high street until it reopens.",
    "Astronomers have found a planet the size of Earth orbiting a small star forty light "
    "years away, in the zone where water could be liquid.",
    "The chess champion defended her title after a tense final game that lasted more than "
    "six hours and ended when her opponent resigned.",
    "A good night's sleep helps the brain store memories. Teenagers need about nine hours, "
    "more than most of them get.",
    "The bridge was closed to traffic after engineers found cracks in two of its steel "
    "supports during a routine inspection.",
]

#: (index of the original, its near duplicate)
NEAR_DUPLICATES = [
    # whitespace, punctuation and case
    (
        0,
        "The city museum opens at nine in the morning on weekdays.  Admission is free for "
        "children under twelve; guided tours leave from the main hall every hour!",
    ),
    (
        4,
        "python lists are ordered and mutable.\nYou can append items, remove them by value "
        "and sort the list in place with its sort method",
    ),
    (
        9,
        "THE CENTRAL BANK RAISED INTEREST RATES BY A QUARTER OF A POINT TO SLOW INFLATION. "
        "MORTGAGE PAYMENTS ARE LIKELY TO RISE FOR MILLIONS OF HOUSEHOLDS.",
    ),
    (
        15,
        "The train to the airport leaves every fifteen minutes from platform four -- tickets "
        "are cheaper if you buy them before you board...",
    ),
    # one word changed
    (
        2,
        "To bake the bread, mix the flour, water, salt and yeast, then knead the dough for "
        "fifteen minutes. Let it rise for an hour before shaping the loaf and baking it in a "
        "hot oven.",
    ),
    (
        3,
        "The home team scored twice in the second half and won the game three to one. Their "
        "goalkeeper saved a penalty in the final minutes to keep the lead.",
    ),
    (
        12,
        "The hospital opened a new wing for kids with cancer. It has twenty beds, a "
        "playroom and rooms where parents can stay overnight.",
    ),
    (
        21,
        "The chess champion defended her title after a tense last game that lasted more than "
        "six hours and ended when her opponent resigned.",
    ),
]
